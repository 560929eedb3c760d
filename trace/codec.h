// Conversion between the plain records (trace/records.h) and the Cap'n Proto schema. Internal to
// lockstep_trace: only the recorder, the reader and tests include it.
//
// Encoders assume a record the recorder already checked. Decoders copy without judging values,
// except that they reject enum values the schema does not define (ls::Error naming the field);
// the reader checks list lengths before decoding and every value after (trace/reader.cpp).
#pragma once

#include "trace/records.h"
#include "trace/trace.capnp.h"

namespace ls::trace::codec {

void encode(const TraceHeader& header, schema::Header::Builder out);
void encode(const StepInputRecord& record, schema::StepInput::Builder out);
void encode(const StepOutputRecord& record, schema::StepOutput::Builder out);
void encode(const TraceEvent& event, schema::Event::Builder out);
void encode(const TraceFooter& footer, schema::Footer::Builder out);
void encode(const StepStatsRecord& stats, schema::StepStats::Builder out);

// Decoders reuse the capacity of `out`'s vectors.
void decode(schema::Header::Reader in, TraceHeader& out);
void decode(schema::StepInput::Reader in, StepInputRecord& out);
void decode(schema::StepOutput::Reader in, StepOutputRecord& out);
void decode(schema::Event::Reader in, TraceEvent& out);
void decode(schema::Footer::Reader in, TraceFooter& out);
void decode(schema::StepStats::Reader in, StepStatsRecord& out);

}  // namespace ls::trace::codec
