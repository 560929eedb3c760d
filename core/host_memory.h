// A guard for allocations sized by untrusted input (a trace header, a config.json): refuse, with
// a clear error, what this machine cannot hold instead of thrashing or being killed. And zeros
// whose pages the OS maps only where they are written.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>

namespace ls {

// Physical memory of this machine, in bytes.
uint64_t host_memory_bytes();

// Throws ls::Error naming `what` when `bytes` exceeds three quarters of physical memory.
void require_host_memory(uint64_t bytes, std::string_view what);

// `count` floats, all zero, whose pages the OS maps on first touch: calloc takes a large block
// from fresh pages, known to be zero, without writing it, so a pool sized for every row's whole
// context (the CPU reference's KV) costs time and memory only where steps write. A std::vector's
// zeros touch every page up front: qwen3-0.6b's default KV pool, 1.9 GB, took ~6 s of its start.
class ZeroedFloats {
 public:
  ZeroedFloats() = default;
  explicit ZeroedFloats(size_t count);  // throws ls::Error when the allocation fails
  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float[], Free> data_;
  size_t count_ = 0;
};

}  // namespace ls
