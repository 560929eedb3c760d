#!/bin/sh
# Regenerates the trace reader's seed corpus (fuzz/corpus/trace_reader) in this build's trace
# format with lockstep itself, from the repository root: fuzz/make_corpus.sh [LOCKSTEP]
# (default build/lockstep). The inputs: `generate --record` of examples/prompts.jsonl's first
# line (run_1_request) and first three (run_3_requests); `sim --seed 3 --spec --faults all
# --record` (sim-spec-faults: drafts, cache ops, faults); that trace without its last frame, the
# footer (events_no_footer: a killed writer's file); and cuts of the first two at bytes 100
# (inside the header record) and 2483 (inside a record).
set -eu
lockstep=${1:-build/lockstep}
dir=fuzz/corpus/trace_reader
mkdir -p "$dir"
head -n 1 examples/prompts.jsonl |
  "$lockstep" generate --prompts - --record "$dir/run_1_request.bin" -q > /dev/null
head -n 3 examples/prompts.jsonl |
  "$lockstep" generate --prompts - --record "$dir/run_3_requests.bin" -q > /dev/null
"$lockstep" sim --seed 3 --spec --faults all --record "$dir/sim-spec-faults.bin" > /dev/null
# The framing (trace/framing.h): a 16-byte preamble, then frames of a 16-byte header whose first
# four bytes are the message's size (little-endian) and the message.
footer=$(python3 - "$dir/sim-spec-faults.bin" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
offset, last = 16, 16
while offset < len(data):
    last = offset
    offset += 16 + struct.unpack_from("<I", data, offset)[0]
print(last)
PY
)
head -c "$footer" "$dir/sim-spec-faults.bin" > "$dir/events_no_footer.bin"
head -c 100 "$dir/run_1_request.bin" > "$dir/run_1_request_cut_in_header.bin"
head -c 2483 "$dir/run_3_requests.bin" > "$dir/run_3_requests_cut_mid_record.bin"
for f in "$dir"/*.bin; do
  printf '%s: ' "$f"
  "$lockstep" trace inspect "$f" 2>&1 | grep -E '^(format|truncated|lockstep: error)' | tr '\n' ' '
  echo
done
