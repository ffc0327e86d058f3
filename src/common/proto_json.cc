#include "common/proto_json.h"

#include <google/protobuf/descriptor.h>

namespace hetps {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

nlohmann::json Value(const Message& m, const Reflection& r,
                     const FieldDescriptor* f, int i) {
  const bool repeated = f->is_repeated();
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return repeated ? r.GetRepeatedInt32(m, f, i) : r.GetInt32(m, f);
    case FieldDescriptor::CPPTYPE_INT64:
      return repeated ? r.GetRepeatedInt64(m, f, i) : r.GetInt64(m, f);
    case FieldDescriptor::CPPTYPE_UINT32:
      return repeated ? r.GetRepeatedUInt32(m, f, i) : r.GetUInt32(m, f);
    case FieldDescriptor::CPPTYPE_UINT64:
      return repeated ? r.GetRepeatedUInt64(m, f, i) : r.GetUInt64(m, f);
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return repeated ? r.GetRepeatedDouble(m, f, i) : r.GetDouble(m, f);
    case FieldDescriptor::CPPTYPE_FLOAT:
      return repeated ? r.GetRepeatedFloat(m, f, i) : r.GetFloat(m, f);
    case FieldDescriptor::CPPTYPE_BOOL:
      return repeated ? r.GetRepeatedBool(m, f, i) : r.GetBool(m, f);
    case FieldDescriptor::CPPTYPE_ENUM:
      return (repeated ? r.GetRepeatedEnum(m, f, i) : r.GetEnum(m, f))->name();
    case FieldDescriptor::CPPTYPE_STRING:
      return repeated ? r.GetRepeatedString(m, f, i) : r.GetString(m, f);
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return ProtoToJson(repeated ? r.GetRepeatedMessage(m, f, i)
                                  : r.GetMessage(m, f));
  }
  return nullptr;
}

}  // namespace

nlohmann::json ProtoToJson(const Message& message) {
  nlohmann::json out = nlohmann::json::object();
  const auto* descriptor = message.GetDescriptor();
  const Reflection& r = *message.GetReflection();
  for (int k = 0; k < descriptor->field_count(); ++k) {
    const FieldDescriptor* f = descriptor->field(k);
    if (f->is_repeated()) {
      nlohmann::json list = nlohmann::json::array();
      for (int i = 0; i < r.FieldSize(message, f); ++i) {
        list.push_back(Value(message, r, f, i));
      }
      out[f->name()] = std::move(list);
    } else {
      out[f->name()] = Value(message, r, f, 0);
    }
  }
  return out;
}

}  // namespace hetps
