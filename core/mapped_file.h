// A read-only private mapping of a whole regular file: safetensors checkpoints and trace files.
// The descriptor is closed right after mmap (the mapping keeps the file alive on its own). One
// owner; moves, never copies. An empty file maps to no bytes (mmap refuses length 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace ls {

class MappedFile {
 public:
  MappedFile() = default;
  // `what` names the file in errors ("trace", "safetensors file"): ls::Error naming the path and
  // the system's reason when it cannot be opened, is not a regular file or cannot be mapped.
  MappedFile(const std::filesystem::path& path, const std::string& what);
  ~MappedFile() { reset(); }
  MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Tells the kernel the file is read front to back (read-ahead).
  void advise_sequential() const;
  // Drops the pages of [begin, end) from this process; they stay in the page cache.
  void release(uint64_t begin, uint64_t end) const;

 private:
  void reset();
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ls
