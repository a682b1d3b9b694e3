// TensorBoard event-file writer (scalars only), no TensorFlow dependency.
//
// File: <logdir>/events.out.tfevents.<unix seconds>.<host>.<pid>.<n>. It is a sequence of
// TFRecords: uint64 length (little endian), uint32 masked crc32c(length bytes),
// data, uint32 masked crc32c(data); mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
// Each record's data is a serialized tensorflow.Event protobuf, encoded here
// by hand:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3;
//             Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record carries file_version "brain.Event:2"; each write() adds one
// Event whose Summary holds one Value per metric.
//
// A run keeps one event file (open_run): a resumed run appends to it after
// cutting the events past its checkpoint's step, so TensorBoard never shows a
// step twice.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "train/metrics_writer.h"

namespace grpo {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), e.g. crc32c("123456789") = 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t crc32c_mask(uint32_t crc);

// Framing and encoding, exposed for tests.
std::string tfrecord_frame(std::string_view data);
std::string tb_event_file_version(double wall_time);
std::string tb_event_scalars(double wall_time, int64_t step, const MetricList& metrics);

class TensorBoardWriter : public MetricWriter {
 public:
  // Creates `logdir` if needed and opens a new event file in it.
  static Result<std::unique_ptr<TensorBoardWriter>> open(const std::string& logdir);
  // The one event file of a run in `logdir`.
  // resume_step < 0 (a fresh run): event files left in `logdir` are removed and a new one is opened.
  // resume_step >= 0: the event files in `logdir` (oldest first by their time stamp; a later file
  // replaces the steps it repeats) are merged into the oldest one, keeping the events with
  // step <= resume_step and dropping a torn last record; that file is then appended to.
  // No event file yet: a new one, as open().
  static Result<std::unique_ptr<TensorBoardWriter>> open_run(const std::string& logdir, int64_t resume_step);
  ~TensorBoardWriter() override;
  Status write(int64_t step, double wall_time, const MetricList& metrics) override;
  Status flush() override;
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  Status append(const std::string& event);
  std::FILE* f_;
  std::string path_;
};

}  // namespace grpo
