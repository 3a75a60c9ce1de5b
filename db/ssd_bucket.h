// SsdBucket: the SSD tier's bookkeeping for one bucket, pending or on disk.
#ifndef KVENGINE_DB_SSD_BUCKET_H_
#define KVENGINE_DB_SSD_BUCKET_H_

#include <atomic>
#include <memory>
#include <vector>

#include "table/bucket_builder.h"
#include "table/bucket_reader.h"

namespace kvengine {

struct SsdBucket {
  enum class State { kOpen, kSealed, kOnDisk };

  // All fields but `readers` are guarded by SsdTier::mu_.
  uint64_t id = 0;
  State state = State::kOpen;
  std::shared_ptr<BucketBuilder> builder;  // the image, until the file is in place
  std::shared_ptr<BucketReader> reader;    // once on disk
  std::vector<BucketEntry> staged;         // committed values, for the index
  int staging = 0;                         // tickets not yet committed or aborted
  uint64_t opened_micros = 0;
  uint64_t file_size = 0;      // on disk; the image's used bytes before
  uint64_t total_bytes = 0;    // value bytes of every entry
  uint64_t deleted_bytes = 0;  // value bytes no longer reachable through the map
  uint64_t keys = 0;
  uint64_t live_keys = 0;
  uint64_t last_access = 0;  // SsdTier's access clock, for LRU choices
  bool compacting = false;
  bool write_failed = false;
  bool writing = false;  // a writer thread has taken it

  // Reads in flight against the file; a retired bucket's file is deleted only once
  // this is zero.
  std::atomic<int> readers{0};

  const char* StateName() const {
    switch (state) {
      case State::kOpen:
        return "open";
      case State::kSealed:
        return "sealed";
      case State::kOnDisk:
        return "on_disk";
    }
    return "?";
  }
};

}  // namespace kvengine

#endif  // KVENGINE_DB_SSD_BUCKET_H_
