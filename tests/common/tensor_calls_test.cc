// The tensor calls' wire forms: what PushCall and PullSparseCall send parses
// as the ordinary protobuf request, and PulledRows reads an ordinary
// PullSparseResponse into the caller's rows.
#include "common/tensor_calls.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "common/slices.h"
#include "gtest/gtest.h"

namespace hetps {
namespace {

// `buffer`'s bytes, in one string.
std::string Bytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

template <typename T>
TensorSlice<T> Iota(size_t n, T first) {
  TensorSlice<T> t(n);
  std::iota(t.data.begin(), t.data.end(), first);
  return t;
}

template <typename T>
std::string AsBytes(std::span<const T> values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size_bytes());
}

// A push of a large gradient, an encoded one and a small dense one.
PushCall ThreeGradientPush() {
  PushCall call;
  call.message.set_worker_id(3);
  call.message.set_clock(41);
  call.message.set_map_version(2);
  call.gradients.resize(3);
  PushCall::Gradient& large = call.gradients[0];
  large.message.set_table("emb");
  large.message.set_dim(16);
  large.keys = Iota<uint64_t>(1000, 7);
  large.values = Iota<float>(16000, 0.5f);
  PushCall::Gradient& encoded = call.gradients[1];
  encoded.message.set_table("wide");
  encoded.message.set_dim(1);
  encoded.message.set_codec(2);
  encoded.message.set_values("a codec's payload");
  PushCall::Gradient& small = call.gradients[2];
  small.message.set_table("dense");
  small.values = Iota<float>(3, -1.0f);
  return call;
}

// Large tensors go as slices of their own, small ones copied: both read
// back as the fields they stand for, beside every other field.
TEST(TensorCallsTest, APushCallParsesAsThePushRequest) {
  const PushCall call = ThreeGradientPush();
  const PushCall::Gradient& large = call.gradients[0];
  const PushCall::Gradient& small = call.gradients[2];
  grpc::ByteBuffer buffer;
  bool own = false;
  ASSERT_TRUE(
      grpc::SerializationTraits<PushCall>::Serialize(call, &buffer, &own).ok());
  EXPECT_TRUE(own);
  rpc::PushRequest sent;
  ASSERT_TRUE(sent.ParseFromString(Bytes(buffer)));
  EXPECT_EQ(sent.worker_id(), 3u);
  EXPECT_EQ(sent.clock(), 41u);
  EXPECT_EQ(sent.map_version(), 2u);
  ASSERT_EQ(sent.gradients_size(), 3);
  EXPECT_EQ(sent.gradients(0).table(), "emb");
  EXPECT_EQ(sent.gradients(0).dim(), 16u);
  EXPECT_EQ(sent.gradients(0).keys(), AsBytes<uint64_t>(large.keys.data));
  EXPECT_EQ(sent.gradients(0).values(), AsBytes<float>(large.values.data));
  EXPECT_EQ(sent.gradients(1).table(), "wide");
  EXPECT_EQ(sent.gradients(1).codec(), 2u);
  EXPECT_EQ(sent.gradients(1).keys(), "");
  EXPECT_EQ(sent.gradients(1).values(), "a codec's payload");
  EXPECT_EQ(sent.gradients(2).table(), "dense");
  EXPECT_EQ(sent.gradients(2).values(), AsBytes<float>(small.values.data));
}

TEST(TensorCallsTest, APullCallParsesAsThePullRequest) {
  PullSparseCall call;
  call.message.set_table("emb");
  call.message.set_dim(8);
  call.message.set_clock(5);
  call.keys = Iota<uint64_t>(20000, 100);
  grpc::ByteBuffer buffer;
  bool own = false;
  ASSERT_TRUE(
      grpc::SerializationTraits<PullSparseCall>::Serialize(call, &buffer, &own)
          .ok());
  rpc::PullSparseRequest sent;
  ASSERT_TRUE(sent.ParseFromString(Bytes(buffer)));
  EXPECT_EQ(sent.table(), "emb");
  EXPECT_EQ(sent.dim(), 8u);
  EXPECT_EQ(sent.clock(), 5u);
  EXPECT_EQ(sent.keys(), AsBytes<uint64_t>(call.keys.data));
  EXPECT_EQ(ToMessage(call).SerializeAsString(), sent.SerializeAsString());
}

// A reply as the server sends it: the message, its rows a slice after it.
grpc::ByteBuffer Reply(const rpc::PullSparseResponse& head,
                       std::span<const float> rows) {
  TensorSlice<float> values(rows.size());
  std::copy(rows.begin(), rows.end(), values.data.begin());
  return SerializeWithBytesField(
      head, rpc::PullSparseResponse::kValuesFieldNumber, values.slice);
}

// `buffer`'s bytes again, in slices of `size` (as gRPC receives them: a
// row may begin in one and end in the next).
grpc::ByteBuffer Resliced(const grpc::ByteBuffer& buffer, size_t size) {
  const std::string bytes = Bytes(buffer);
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += size) {
    slices.emplace_back(bytes.substr(at, size));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// Row i of the reply lands at positions[i]; rows not asked for stay; the
// other fields arrive in the message, without the rows. Rows whose
// positions follow each other and rows that do not, rows within one of
// gRPC's buffers and rows across two.
TEST(TensorCallsTest, PulledRowsGoStraightToTheirPositions) {
  struct Case {
    size_t dim;
    size_t slice_bytes;  // 0: as the server sends it
    std::vector<uint32_t> positions;
  };
  const std::vector<Case> cases = {
      {2, 0, {0, 1, 5, 3}},       {1024, 0, {0, 1, 5, 3}},
      {1024, 1000, {0, 1, 5, 3}}, {1024, 1000, {1, 2, 3, 4}},
      {3, 7, {2, 3, 4, 5}},       {3, 7, {4, 0, 1, 5}}};
  for (const Case& c : cases) {
    const size_t dim = c.dim;
    rpc::PullSparseResponse head;
    head.set_applied_rounds(12);
    head.set_map_version(4);
    head.mutable_dense()->set_offset(9);
    std::vector<float> sent(4 * dim);
    std::iota(sent.begin(), sent.end(), 1.0f);
    grpc::ByteBuffer buffer = Reply(head, sent);
    if (c.slice_bytes > 0) buffer = Resliced(buffer, c.slice_bytes);

    std::vector<float> rows(6 * dim, -1.0f);
    const std::vector<uint32_t>& positions = c.positions;
    PulledRows answer{
        .rows = rows, .positions = positions, .dim = dim, .message = {}};
    ASSERT_TRUE(
        grpc::SerializationTraits<PulledRows>::Deserialize(&buffer, &answer)
            .ok())
        << "dim " << dim;
    for (size_t i = 0; i < positions.size(); ++i) {
      for (size_t j = 0; j < dim; ++j) {
        ASSERT_EQ(rows[positions[i] * dim + j], sent[i * dim + j])
            << "dim " << dim << " row " << i;
      }
    }
    for (size_t pos = 0; pos < 6; ++pos) {
      if (std::find(positions.begin(), positions.end(), pos) !=
          positions.end()) {
        continue;
      }
      for (size_t j = 0; j < dim; ++j) ASSERT_EQ(rows[pos * dim + j], -1.0f);
    }
    EXPECT_EQ(answer.message.applied_rounds(), 12u);
    EXPECT_EQ(answer.message.map_version(), 4u);
    EXPECT_EQ(answer.message.dense().offset(), 9u);
    EXPECT_TRUE(answer.message.values().empty());
  }
}

// A reply with another number of rows, or none, or bytes that are no
// message, fails the call, and no row is written.
TEST(TensorCallsTest, AReplyThatDoesNotFitIsRefusedBeforeAnyRowIsWritten) {
  const std::vector<uint32_t> positions = {0, 1};
  const std::vector<float> three_rows(6, 5.0f);
  rpc::PullSparseResponse head;
  head.set_applied_rounds(1);
  std::vector<grpc::ByteBuffer> replies;
  replies.push_back(Reply(head, three_rows));
  replies.push_back(Reply(head, {}));
  const std::string garbage = "\x0a\xff\xff\xff\x7f not a message";
  grpc::Slice slice(garbage);
  replies.emplace_back(&slice, 1);
  for (grpc::ByteBuffer& reply : replies) {
    std::vector<float> rows(4, -1.0f);
    PulledRows answer{
        .rows = rows, .positions = positions, .dim = 2, .message = {}};
    const grpc::Status s =
        grpc::SerializationTraits<PulledRows>::Deserialize(&reply, &answer);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL) << s.error_message();
    EXPECT_EQ(rows, std::vector<float>(4, -1.0f));
  }
}

std::string SliceBytes(const grpc::Slice& slice) {
  return std::string(reinterpret_cast<const char*>(slice.begin()),
                     slice.size());
}

// A server reads a push whoever wrote it: a client's PushCall (its
// message fields before the tensors) and a plain protobuf message (fields
// in number order, a codec after its payload), in whatever slices gRPC
// received them: each gradient's keys and values in buffers of their own,
// the rest in the message, and whether the values are finite.
TEST(TensorCallsTest, APushIsParsedWithItsTensorsApartAndTheirValuesChecked) {
  PushCall call = ThreeGradientPush();
  call.message.set_oldest_read(9);
  const PushCall::Gradient& emb = call.gradients[0];
  PushCall::Gradient& bad = call.gradients[2];
  bad.values.data[2] = std::numeric_limits<float>::infinity();
  grpc::ByteBuffer from_client;
  bool own = false;
  ASSERT_TRUE(
      grpc::SerializationTraits<PushCall>::Serialize(call, &from_client, &own)
          .ok());
  rpc::PushRequest message;
  message.set_worker_id(4);
  message.set_batch_size(2);
  rpc::TableGradient* encoded = message.add_gradients();
  encoded->set_table("wide");
  encoded->set_values("a codec's payload");
  encoded->set_codec(2);
  rpc::TableGradient* nan = message.add_gradients();
  nan->set_table("dense");
  const float nan_values[] = {1, std::numeric_limits<float>::quiet_NaN()};
  nan->set_values(std::string(reinterpret_cast<const char*>(nan_values),
                              sizeof(nan_values)));
  const std::string plain = message.SerializeAsString();
  grpc::Slice plain_slice(plain);

  for (size_t size : {size_t{7}, size_t{4096}, size_t{1} << 20}) {
    SCOPED_TRACE(size);
    ReceivedPush push;
    grpc::ByteBuffer resliced = Resliced(from_client, size);
    ASSERT_TRUE(ParsePush(&resliced, &push).ok());
    EXPECT_EQ(push.message.worker_id(), 3u);
    EXPECT_EQ(push.message.clock(), 41u);
    EXPECT_EQ(push.message.oldest_read(), 9u);
    ASSERT_EQ(push.message.gradients_size(), 3);
    ASSERT_EQ(push.gradients.size(), 3u);
    EXPECT_EQ(push.message.gradients(0).table(), "emb");
    EXPECT_EQ(push.message.gradients(0).dim(), 16u);
    EXPECT_EQ(push.message.gradients(0).keys(), "");
    EXPECT_EQ(push.message.gradients(0).values(), "");
    EXPECT_EQ(SliceBytes(push.gradients[0].keys),
              AsBytes<uint64_t>(emb.keys.data));
    EXPECT_EQ(SliceBytes(push.gradients[0].values),
              AsBytes<float>(emb.values.data));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(push.gradients[0].values.begin()) %
                  alignof(float),
              0u);
    EXPECT_TRUE(push.gradients[0].finite);
    EXPECT_EQ(push.message.gradients(1).codec(), 2u);
    EXPECT_EQ(SliceBytes(push.gradients[1].values), "a codec's payload");
    EXPECT_EQ(push.message.gradients(2).table(), "dense");
    EXPECT_EQ(push.gradients[2].keys.size(), 0u);
    EXPECT_EQ(SliceBytes(push.gradients[2].values),
              AsBytes<float>(bad.values.data));
    EXPECT_FALSE(push.gradients[2].finite);

    ReceivedPush parsed;
    grpc::ByteBuffer plain_buffer(&plain_slice, 1);
    grpc::ByteBuffer plain_resliced = Resliced(plain_buffer, size);
    ASSERT_TRUE(ParsePush(&plain_resliced, &parsed).ok());
    EXPECT_EQ(parsed.message.worker_id(), 4u);
    EXPECT_EQ(parsed.message.batch_size(), 2u);
    ASSERT_EQ(parsed.gradients.size(), 2u);
    EXPECT_EQ(parsed.message.gradients(0).codec(), 2u);
    EXPECT_EQ(SliceBytes(parsed.gradients[0].values), "a codec's payload");
    EXPECT_EQ(parsed.gradients[0].keys.size(), 0u);
    EXPECT_EQ(parsed.message.gradients(1).table(), "dense");
    EXPECT_EQ(SliceBytes(parsed.gradients[1].values), nan->values());
    EXPECT_FALSE(parsed.gradients[1].finite);
  }
}

// The NaN/Inf check made while a push's values are copied sees a bad
// value wherever gRPC's buffers cut it, and only a bad one. (Buffers of
// at least 24 bytes: gRPC joins smaller ones into one.)
TEST(TensorCallsTest, AValueCutByGrpcsBuffersIsCheckedWhole) {
  for (size_t cut : {25, 26, 27, 29, 30, 31}) {
    for (int bad_at = -1; bad_at < 32; ++bad_at) {
      SCOPED_TRACE(::testing::Message() << "cut " << cut << " bad " << bad_at);
      rpc::PushRequest message;
      message.set_worker_id(1);
      rpc::TableGradient* g = message.add_gradients();
      g->set_table("emb");
      std::vector<float> values(32);
      for (size_t i = 0; i < values.size(); ++i) values[i] = 1e30f - i;
      if (bad_at >= 0) {
        values[bad_at] = std::numeric_limits<float>::infinity();
      }
      g->set_values(std::string(reinterpret_cast<const char*>(values.data()),
                                values.size() * sizeof(float)));
      const std::string bytes = message.SerializeAsString();
      grpc::Slice whole(bytes);
      grpc::ByteBuffer buffer(&whole, 1);
      grpc::ByteBuffer resliced = Resliced(buffer, cut);
      ReceivedPush push;
      ASSERT_TRUE(ParsePush(&resliced, &push).ok());
      ASSERT_EQ(push.gradients.size(), 1u);
      EXPECT_EQ(SliceBytes(push.gradients[0].values), g->values());
      EXPECT_EQ(push.gradients[0].finite, bad_at < 0);
    }
  }
}

// A request cut short, or whose lengths run past its end, is refused,
// allocating nothing for a length it does not carry.
TEST(TensorCallsTest, APushCutShortOrWithLengthsPastItsEndIsRefused) {
  rpc::PushRequest message;
  message.set_worker_id(1);
  rpc::TableGradient* g = message.add_gradients();
  g->set_table("emb");
  g->set_keys(std::string(80, 'k'));
  g->set_values(std::string(40, 'v'));
  const std::string whole = message.SerializeAsString();
  // (The first two bytes are worker_id: a whole message on their own.)
  ASSERT_EQ(whole.substr(0, 2), std::string("\x10\x01", 2));
  for (size_t cut = 1; cut < whole.size(); ++cut) {
    if (cut == 2) continue;
    grpc::Slice slice(whole.substr(0, cut));
    grpc::ByteBuffer buffer(&slice, 1);
    ReceivedPush push;
    EXPECT_FALSE(ParsePush(&buffer, &push).ok()) << "cut at " << cut;
  }
  // The gradient's keys claim 2^31 bytes inside a gradient of a few.
  std::string huge = whole;
  const size_t keys_at = huge.find(std::string(80, 'k'));
  ASSERT_NE(keys_at, std::string::npos);
  ASSERT_EQ(static_cast<uint8_t>(huge[keys_at - 1]), 80u);  // one-byte length
  huge.replace(keys_at - 1, 1, std::string("\x80\x80\x80\x80\x08", 5));
  grpc::Slice slice(huge);
  grpc::ByteBuffer buffer(&slice, 1);
  ReceivedPush push;
  const grpc::Status s = ParsePush(&buffer, &push);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "push: the request is not a PushRequest");

  // What protobuf refuses and protobuf's CodedInputStream alone would take
  // (found by tests/fuzz/push_fuzzer): a tag of ten bytes, and a gradient
  // that ends inside a tag, the message going on after it.
  const std::string long_tag(
      "\x20\x16\xd0\xd0\xd0\xd0\xd0\xd0\xd0\xd0\xb5\x48\x48\x48", 14);
  const std::string cut_tag(
      "\x2a\x17\x0a\x05nds\x10\x06\x22\x06\x22\x0c\0\0\0\0"
      "\xff\xff\xff\xff\xff\xff\xff\xff\xb4",
      25);
  for (const std::string& bytes : {long_tag, cut_tag}) {
    ASSERT_FALSE(rpc::PushRequest().ParseFromString(bytes));
    grpc::Slice refused(bytes);
    grpc::ByteBuffer refused_buffer(&refused, 1);
    ReceivedPush refused_push;
    EXPECT_FALSE(ParsePush(&refused_buffer, &refused_push).ok());
  }
}

// Groups inside a gradient nest one level less deep than at the top:
// the gradient is a message of its own, and ParsePush counts it as
// protobuf does.
TEST(TensorCallsTest, GroupsInAGradientNestAsDeepAsProtobufAllows) {
  int deepest_taken = 0;
  for (int depth = 90; depth <= 110; ++depth) {
    const std::string gradient = std::string(
                                     "\x0a\x03"
                                     "emb") +
                                 std::string(depth, '\x73') +
                                 std::string(depth, '\x74');
    ASSERT_LT(gradient.size(), 1u << 14);  // its length in two bytes
    const std::string bytes =
        std::string("\x2a") +
        static_cast<char>(0x80 | (gradient.size() & 0x7f)) +
        static_cast<char>(gradient.size() >> 7) + gradient;
    const bool parsed = rpc::PushRequest().ParseFromString(bytes);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer buffer(&slice, 1);
    ReceivedPush push;
    EXPECT_EQ(ParsePush(&buffer, &push).ok(), parsed) << depth;
    if (parsed) deepest_taken = depth;
  }
  EXPECT_GT(deepest_taken, 90);
  EXPECT_LT(deepest_taken, 110);
}

// A frame is an ordinary TensorFrame on the wire, and reads back into its
// header and a body that shares the frame's slices (a large tensor is not
// copied), in whatever slices it was received.
TEST(TensorCallsTest, AFrameReadsBackAsItsHeaderAndItsBodyUncopied) {
  const PushCall push = ThreeGradientPush();
  grpc::ByteBuffer body;
  bool own;
  ASSERT_TRUE(
      grpc::SerializationTraits<PushCall>::Serialize(push, &body, &own).ok());
  const std::string body_bytes = Bytes(body);
  rpc::TensorFrame header;
  header.set_id(1234567);
  header.set_kind(rpc::TensorFrame::PULL_SPARSE);
  header.set_code(5);
  header.set_error("why");
  grpc::ByteBuffer frame = WriteFrame(header, body);

  rpc::TensorFrame parsed;
  ASSERT_TRUE(parsed.ParseFromString(Bytes(frame)));
  EXPECT_EQ(parsed.id(), 1234567u);
  EXPECT_EQ(parsed.body(), body_bytes);

  for (size_t slice_bytes : {size_t{0}, size_t{7}, size_t{4096}}) {
    grpc::ByteBuffer received =
        slice_bytes == 0 ? frame : Resliced(frame, slice_bytes);
    rpc::TensorFrame read_header;
    grpc::ByteBuffer read_body;
    ASSERT_TRUE(ReadFrame(&received, &read_header, &read_body).ok());
    EXPECT_EQ(read_header.id(), 1234567u);
    EXPECT_EQ(read_header.kind(), rpc::TensorFrame::PULL_SPARSE);
    EXPECT_EQ(read_header.code(), 5);
    EXPECT_EQ(read_header.error(), "why");
    EXPECT_TRUE(read_header.body().empty());
    EXPECT_EQ(Bytes(read_body), body_bytes) << slice_bytes;
  }
  // As sent: the large gradient's values are the very buffer pushed.
  rpc::TensorFrame read_header;
  grpc::ByteBuffer read_body;
  ASSERT_TRUE(ReadFrame(&frame, &read_header, &read_body).ok());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(read_body.Dump(&slices).ok());
  const uint8_t* values = push.gradients[0].values.slice.begin();
  EXPECT_TRUE(
      std::any_of(slices.begin(), slices.end(),
                  [&](const grpc::Slice& s) { return s.begin() == values; }));

  // No body: an empty one.
  grpc::ByteBuffer bare = WriteFrame(header, grpc::ByteBuffer());
  ASSERT_TRUE(ReadFrame(&bare, &read_header, &read_body).ok());
  EXPECT_EQ(read_body.Length(), 0u);
}

// Bytes that are no TensorFrame, or a body running past the frame's end,
// are refused.
TEST(TensorCallsTest, BytesThatAreNoFrameAreRefused) {
  rpc::TensorFrame header;
  header.set_id(3);
  header.set_body("twelve bytes");
  std::string cut = header.SerializeAsString();
  cut.resize(cut.size() - 4);
  for (const std::string& bytes :
       {std::string("\x0a\xff\xff\xff\x7f not a frame"), cut}) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer frame(&slice, 1);
    rpc::TensorFrame read_header;
    grpc::ByteBuffer read_body;
    const grpc::Status s = ReadFrame(&frame, &read_header, &read_body);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
}

// ReadFrame takes what protobuf's parser takes and nothing else, in fields
// the frame does not know as well: inside a group, a tag or length of six
// bytes is refused (found by tests/fuzz/frame_fuzzer), so is a group
// ended by another field's end tag or not at all, or nested too deep.
TEST(TensorCallsTest, AFrameIsReadByProtobufsRulesInsideUnknownFields) {
  auto read = [](const std::string& bytes, rpc::TensorFrame* header,
                 std::string* body) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer frame(&slice, 1);
    grpc::ByteBuffer read_body;
    const grpc::Status s = ReadFrame(&frame, header, &read_body);
    if (!s.ok()) return false;
    *body = Bytes(read_body);
    return true;
  };
  rpc::TensorFrame header;
  std::string body;
  // A group (field 14) holding a varint and bytes, then the body.
  const std::string taken(
      "\x08\x07\x73\x08\x01\x32\x02hi\x74\x2a\x03"
      "abc",
      15);
  ASSERT_TRUE(rpc::TensorFrame().ParseFromString(taken));
  ASSERT_TRUE(read(taken, &header, &body));
  EXPECT_EQ(header.id(), 7u);
  EXPECT_EQ(body, "abc");

  const std::string refused[] = {
      // tag 0x78 in six bytes, inside a group
      std::string("\x08\x01\x73\xf8\x80\x80\x80\x80\x00\x01\x74", 11),
      // an unknown field's length 3 in six bytes, inside a group and not
      std::string("\x73\x32\x83\x80\x80\x80\x80\x00"
                  "abc\x74",
                  12),
      std::string("\x32\x83\x80\x80\x80\x80\x00"
                  "abc",
                  10),
      // the body's length in six bytes
      std::string("\x2a\x83\x80\x80\x80\x80\x00"
                  "abc",
                  10),
      // a group ended by field 15's end tag; one not ended
      std::string("\x73\x08\x01\x7c", 4),
      std::string("\x73\x08\x01", 3),
      // a tag 0 inside a group
      std::string("\x73\x00\x74", 3),
  };
  for (const std::string& bytes : refused) {
    ASSERT_FALSE(rpc::TensorFrame().ParseFromString(bytes));
    EXPECT_FALSE(read(bytes, &header, &body))
        << ::testing::PrintToString(bytes);
  }
  // Groups in groups: refused past the same depth as protobuf refuses them.
  int deepest_taken = 0;
  for (int depth = 1; depth <= 130; ++depth) {
    const std::string nested =
        std::string(depth, '\x73') + std::string(depth, '\x74');
    const bool parsed = rpc::TensorFrame().ParseFromString(nested);
    EXPECT_EQ(read(nested, &header, &body), parsed) << depth;
    if (parsed) deepest_taken = depth;
  }
  EXPECT_GE(deepest_taken, 90);
  EXPECT_LT(deepest_taken, 130);
}

// A large tensor buffer given back is the next one of its size: its pages
// are not taken from the heap again.
TEST(TensorCallsTest, ALargeTensorBufferIsReusedOnceGivenBack) {
  const size_t bytes = (3 << 20) + 4096 * 3;  // a size no other test uses
  const uint8_t* first = nullptr;
  {
    grpc::Slice buffer = NewTensorBuffer(bytes);
    first = buffer.begin();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
    EXPECT_EQ(buffer.size(), bytes);
    grpc::Slice held = buffer;  // the transport's reference
  }
  grpc::Slice again = NewTensorBuffer(bytes);
  EXPECT_EQ(again.begin(), first);
  // Held, it is not handed out twice.
  grpc::Slice other = NewTensorBuffer(bytes);
  EXPECT_NE(other.begin(), first);
}

}  // namespace
}  // namespace hetps
