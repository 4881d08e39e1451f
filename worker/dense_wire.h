// Internal to the worker library: the dense push encoding written straight from the
// gradient (one copy), byte-identical to EncodeUpdate of a dense update.
#ifndef ADAPS_WORKER_DENSE_WIRE_H_
#define ADAPS_WORKER_DENSE_WIRE_H_

#include "absl/types/span.h"
#include "common/messages.h"
#include "common/wire_codec.h"

namespace adaps {

SharedBytes EncodeDenseDirect(absl::Span<const float> grad, IndexCoding coding);

}  // namespace adaps

#endif  // ADAPS_WORKER_DENSE_WIRE_H_
