#include "common/slices.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace hetps {
namespace {

using google::protobuf::internal::WireFormatLite;
using Coded = google::protobuf::io::CodedOutputStream;

// A tensor below this many bytes is copied into the message's buffer.
constexpr size_t kOwnSliceBytes = 4096;

// Tensor buffers kept for reuse (NewTensorBuffer): those of at least
// kKeptFrom bytes, up to kKeptBuffers of them and kKeptBytes in all.
constexpr size_t kKeptFrom = 64 << 10;
constexpr size_t kKeptBuffers = 32;
constexpr size_t kKeptBytes = 256 << 20;
// Each buffer starts with a header holding its capacity; the tensor
// follows, aligned as the header.
constexpr size_t kHeaderBytes = 64;

class KeptBuffers {
 public:
  static KeptBuffers& Get() {
    static KeptBuffers* kept = new KeptBuffers;
    return *kept;
  }

  // A buffer of at least `bytes`: the smallest kept one that fits without
  // wasting more than its size again, else a new one.
  uint8_t* Take(size_t bytes) {
    if (bytes >= kKeptFrom) {
      absl::MutexLock lock(&mu_);
      auto best = buffers_.end();
      for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
        const size_t capacity = CapacityOf(*it);
        if (capacity >= bytes && capacity <= 2 * bytes &&
            (best == buffers_.end() || capacity < CapacityOf(*best))) {
          best = it;
        }
      }
      if (best != buffers_.end()) {
        uint8_t* buffer = *best;
        kept_bytes_ -= CapacityOf(buffer);
        buffers_.erase(best);
        return buffer;
      }
    }
    auto* block = static_cast<uint8_t*>(
        ::operator new (kHeaderBytes + bytes, std::align_val_t{kHeaderBytes}));
    std::memcpy(block, &bytes, sizeof(bytes));
    return block + kHeaderBytes;
  }

  // Gives `buffer` back (a slice's destroy callback).
  static void Give(void* buffer) {
    auto* data = static_cast<uint8_t*>(buffer);
    const size_t capacity = CapacityOf(data);
    if (capacity >= kKeptFrom) {
      KeptBuffers& kept = Get();
      absl::MutexLock lock(&kept.mu_);
      if (kept.buffers_.size() < kKeptBuffers &&
          kept.kept_bytes_ + capacity <= kKeptBytes) {
        kept.buffers_.push_back(data);
        kept.kept_bytes_ += capacity;
        return;
      }
    }
    ::operator delete (data - kHeaderBytes, std::align_val_t{kHeaderBytes});
  }

 private:
  static size_t CapacityOf(const uint8_t* data) {
    size_t capacity;
    std::memcpy(&capacity, data - kHeaderBytes, sizeof(capacity));
    return capacity;
  }

  absl::Mutex mu_;
  std::vector<uint8_t*> buffers_ ABSL_GUARDED_BY(mu_);
  size_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

uint32_t LengthDelimitedTag(uint32_t field) {
  return WireFormatLite::MakeTag(field,
                                 WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}

// protobuf's parser (parse_context.h) reads tags and lengths of at most
// five bytes; CodedInputStream alone takes up to ten, dropping the high
// bits. These read them as the parser does.
bool ReadTag(google::protobuf::io::CodedInputStream& in, uint32_t* tag) {
  const int at = in.CurrentPosition();
  *tag = in.ReadTag();
  return *tag != 0 && in.CurrentPosition() - at <= 5;
}
bool ReadLength(google::protobuf::io::CodedInputStream& in, uint32_t* length) {
  const int at = in.CurrentPosition();
  return in.ReadVarint32(length) && in.CurrentPosition() - at <= 5 &&
         *length <= static_cast<uint32_t>(in.BytesUntilLimit());
}

// Copies the field `tag` (already read from `in`) to `out`, false where
// protobuf's parser refuses it. A length and a group are read with the
// parser's rules (WireFormatLite::SkipField takes a length of up to ten
// bytes, and a long tag inside a group); SkipField reads the other wire
// types as the parser does, and refuses an end without its group and wire
// types 6 and 7.
bool CopyField(google::protobuf::io::CodedInputStream& in, uint32_t tag,
               google::protobuf::io::CodedOutputStream& out) {
  switch (WireFormatLite::GetTagWireType(tag)) {
    case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
      uint32_t length;
      std::string bytes;
      if (!ReadLength(in, &length) || !in.ReadString(&bytes, length)) {
        return false;
      }
      out.WriteTag(tag);
      out.WriteVarint32(length);
      out.WriteString(bytes);
      return true;
    }
    case WireFormatLite::WIRETYPE_START_GROUP: {
      if (!in.IncrementRecursionDepth()) return false;
      const uint32_t end =
          WireFormatLite::MakeTag(WireFormatLite::GetTagFieldNumber(tag),
                                  WireFormatLite::WIRETYPE_END_GROUP);
      out.WriteTag(tag);
      for (uint32_t inner; ReadTag(in, &inner);) {
        if (inner == end) {
          in.DecrementRecursionDepth();
          out.WriteTag(end);
          return true;
        }
        if (!CopyField(in, inner, out)) return false;
      }
      return false;  // the group does not end
    }
    default:
      return WireFormatLite::SkipField(&in, tag, &out);
  }
}

}  // namespace

grpc::Slice NewTensorBuffer(size_t bytes) {
  return grpc::Slice(KeptBuffers::Get().Take(bytes), bytes, &KeptBuffers::Give);
}

void WireWriter::Append(const google::protobuf::MessageLite& message) {
  message.AppendToString(&buffer_);
}

void WireWriter::Field(uint32_t field, size_t length) {
  const uint32_t tag = LengthDelimitedTag(field);
  const size_t size = buffer_.size();
  buffer_.resize(size + Coded::VarintSize32(tag) + Coded::VarintSize64(length));
  auto* end = reinterpret_cast<uint8_t*>(buffer_.data()) + size;
  Coded::WriteVarint64ToArray(length, Coded::WriteVarint32ToArray(tag, end));
}

void WireWriter::Bytes(grpc::Slice bytes) {
  if (bytes.size() < kOwnSliceBytes) {
    buffer_.append(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
    return;
  }
  if (!buffer_.empty()) {
    slices_.emplace_back(buffer_);
    buffer_.clear();
  }
  slices_.push_back(std::move(bytes));
}

grpc::ByteBuffer WireWriter::Finish() {
  if (!buffer_.empty()) {
    slices_.emplace_back(buffer_);
    buffer_.clear();
  }
  grpc::ByteBuffer out(slices_.data(), slices_.size());
  slices_.clear();
  return out;
}

size_t WireWriter::FieldSize(uint32_t field, size_t length) {
  return Coded::VarintSize32(LengthDelimitedTag(field)) +
         Coded::VarintSize64(length) + length;
}

grpc::ByteBuffer SerializeWithBytesField(
    const google::protobuf::MessageLite& message, uint32_t field,
    grpc::Slice bytes) {
  WireWriter out;
  out.Append(message);
  if (bytes.size() > 0) {
    out.Field(field, bytes.size());
    out.Bytes(std::move(bytes));
  }
  return out.Finish();
}

bool ReadFieldsApart(google::protobuf::io::CodedInputStream& in,
                     std::span<const uint32_t> fields, const FieldReader& take,
                     std::string* rest) {
  google::protobuf::io::StringOutputStream rest_stream(rest);
  google::protobuf::io::CodedOutputStream rest_out(&rest_stream);
  while (in.BytesUntilLimit() > 0) {
    uint32_t tag;
    if (!ReadTag(in, &tag)) return false;
    const uint32_t field = WireFormatLite::GetTagFieldNumber(tag);
    if (tag == LengthDelimitedTag(field) &&
        std::find(fields.begin(), fields.end(), field) != fields.end()) {
      uint32_t length = 0;
      if (!ReadLength(in, &length) || !take(field, length, in)) return false;
    } else if (!CopyField(in, tag, rest_out)) {
      return false;
    }
  }
  return true;
}

grpc::Status ParseWithBytesField(grpc::ByteBuffer* buffer,
                                 google::protobuf::MessageLite* message,
                                 uint32_t field, const BytesFieldReader& take,
                                 const grpc::Status& malformed) {
  // The buffer is ours to free (gRPC hands a received message over).
  struct Consume {
    grpc::ByteBuffer* buffer;
    ~Consume() { buffer->Clear(); }
  } consume{buffer};
  std::string rest;  // the message's other fields, parsed at the end
  grpc::Status taken;
  {
    const size_t total = buffer->Length();
    grpc::ProtoBufferReader reader(buffer);
    if (!reader.status().ok()) return malformed;
    google::protobuf::io::CodedInputStream in(&reader);
    if (total > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return malformed;
    }
    in.PushLimit(static_cast<int>(total));
    const uint32_t fields[] = {field};
    const bool read = ReadFieldsApart(
        in, fields,
        [&](uint32_t, uint32_t length,
            google::protobuf::io::CodedInputStream& from) {
          taken = take(length, from);
          return taken.ok();
        },
        &rest);
    if (!taken.ok()) return taken;
    if (!read) return malformed;
  }
  if (!message->ParseFromString(rest)) return malformed;
  return grpc::Status::OK;
}

}  // namespace hetps
