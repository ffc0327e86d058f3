// A protobuf message as JSON, field names as in the .proto and numbers as
// numbers (protobuf's own JSON printer writes 64-bit integers as strings):
// what `hetps status --json` and the summaries print, so that a field added
// to a status message shows up without another edit.
#pragma once

#include <google/protobuf/message.h>

#include "nlohmann/json.hpp"

namespace hetps {

// Every field, set or not (proto3 defaults included); enums by name;
// repeated fields as arrays; messages as objects.
nlohmann::json ProtoToJson(const google::protobuf::Message& message);

}  // namespace hetps
