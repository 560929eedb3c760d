#include "core/mapped_file.h"

#include "core/check.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace ls {

MappedFile::MappedFile(const std::filesystem::path& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  LS_REQUIRE(fd >= 0, "cannot open {} {}: {}", what, path.string(), std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int stat_errno = errno;
  if (!stat_ok || !S_ISREG(st.st_mode) || st.st_size == 0) {
    ::close(fd);
    LS_REQUIRE(stat_ok, "cannot stat {} {}: {}", what, path.string(), std::strerror(stat_errno));
    LS_REQUIRE(S_ISREG(st.st_mode), "{} {} is not a regular file", what, path.string());
    return;
  }
  const auto size = static_cast<size_t>(st.st_size);
  void* address = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  LS_REQUIRE(address != MAP_FAILED, "cannot map {} {} ({} bytes): {}", what, path.string(), size,
             std::strerror(map_errno));
  data_ = static_cast<const std::byte*>(address);
  size_ = size;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::advise_sequential() const {
  if (data_ != nullptr) ::madvise(const_cast<std::byte*>(data_), size_, MADV_SEQUENTIAL);
}

void MappedFile::release(uint64_t begin, uint64_t end) const {
  if (data_ != nullptr && end > begin) {
    ::madvise(const_cast<std::byte*>(data_) + begin, end - begin, MADV_DONTNEED);
  }
}

void MappedFile::reset() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace ls
