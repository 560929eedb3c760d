"""Trace records as plain Python objects. The C++ reader (trace/reader.h) decodes and validates
every record; these classes only hold the fields it produced."""

from ._lockstep import _TraceReader


class Record:
    """Fields as attributes; to_dict() gives them as a dict (the op of a step input as a dict of
    the seed's FlatForwardOp fields)."""

    __slots__ = ("_fields",)
    kind = "record"

    def __init__(self, fields):
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name):
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __eq__(self, other):
        return type(self) is type(other) and self._fields == other._fields

    def fields(self):
        return tuple(self._fields)

    def to_dict(self):
        return {k: _plain(v) for k, v in self._fields.items()}

    def __repr__(self):
        shown = ", ".join(f"{k}={v!r}" for k, v in self._fields.items())
        return f"{type(self).__name__}({shown})"


def _plain(value):
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class Header(Record):
    __slots__ = ()
    kind = "header"


class StepInput(Record):
    __slots__ = ()
    kind = "step_input"


class StepOutput(Record):
    __slots__ = ()
    kind = "step_output"


class Event(Record):
    __slots__ = ()
    kind = "event"


class Footer(Record):
    __slots__ = ()
    kind = "footer"


class StepStats(Record):
    """When and how a step ran (issue 17): times on the header's step_clock, serving counts."""
    __slots__ = ()
    kind = "step_stats"


_MAKE = {"step_input": StepInput, "step_output": StepOutput, "event": Event, "footer": Footer,
         "step_stats": StepStats}


class TraceFile:
    """An opened trace: `header`, then iterate for the records after it. A corrupt record raises
    lockstep.Error naming the record, its byte offset, the step and the field; a cut-off tail ends
    the iteration and `truncation` says where. `close()`, or the with statement, unmaps the
    file."""

    def __init__(self, path):
        self._reader = _TraceReader(str(path), _MAKE)
        self.header = Header(self._reader.header())

    def __iter__(self):
        return self

    def __next__(self):
        return self._reader.next()

    def close(self):
        """Unmaps the file (before Python collects this object); reading on is a lockstep.Error.
        `with lockstep.open_trace(path) as trace:` closes it on the way out."""
        self._reader.close()

    @property
    def closed(self):
        return self._reader.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def truncation(self):
        return self._reader.truncation()

    @property
    def records_read(self):
        return self._reader.records_read

    @property
    def offset(self):
        return self._reader.offset

    @property
    def file_bytes(self):
        return self._reader.file_bytes


def open_trace(path):
    """Opens a trace file: returns a TraceFile (header + iterator of records)."""
    return TraceFile(path)
