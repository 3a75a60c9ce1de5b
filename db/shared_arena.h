// SharedArena: what the owner's side of DB::Attach (attach/local_server.h) needs of the
// local engine, and nothing more: where the memory tier's arena is, and the two halves
// of a put and of a get whose bytes an attached process copies itself.
//
// The arena is a memfd that attached processes map (docs/attach.md): a client's put
// reserves room in it, the client copies the value in, and the reservation is committed
// as a put of those bytes; a client's get pins a value in it and the client copies it
// out.  Every other call of an attached client -- and the slow half of its get, a value
// that is not in memory -- goes to the DB the owner serves, through kvengine::DB: that
// DB may be a layer above the engine (a cluster router), so that a value only a peer
// holds is read the way a local caller would read it.
//
// The commit is a put, and a put enters at the top of the owner's stack: the arena
// interfaces stack as the DBs do (StackableArena below, RocksDB's StackableDB shape).
// DBImpl implements the arena itself and publishes into its own tiers; ClusterDB is a
// StackableArena over it that overrides Commit alone, sending each key to its owners
// (the keys another member owns from the very slot the client filled, this host's
// published in place).  The namespace layer's part -- mapping a key into its namespace
// under the namespace's guard, so that a drop cannot slip between mapping and
// publication -- is NamespaceView::Guarded, which the local server calls around
// Reserve, Commit and PinInMemory.  The local server is handed the top of this stack
// (api/db_open.cc).
//
// Thread-safety: every method may be called from any number of threads at once; after
// the DB is closed they fail with Aborted.
#ifndef KVENGINE_DB_SHARED_ARENA_H_
#define KVENGINE_DB_SHARED_ARENA_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "db/memory_tier.h"
#include "kvengine/slice.h"
#include "kvengine/status.h"

namespace kvengine {

class SharedArena {
 public:
  virtual ~SharedArena() = default;

  // One of the arenas the memory is cut into, one per trust boundary
  // (Options::namespace_arenas, db/arena_layout.h): its place in the arena, the memfd
  // behind it (-1 without local_listen) and the namespaces it holds, for messages.
  struct Part {
    char* base = nullptr;
    uint64_t size = 0;
    int fd = -1;
    std::string names;
  };

  // Where the arena is: its first byte and its size (locations sent to clients are
  // offsets from arena_base()), and the memfd behind it, which clients map (owned by
  // the arena; -1 when the DB was opened without Options::local_listen).
  virtual char* arena_base() const = 0;
  virtual uint64_t arena_size() const = 0;
  virtual int arena_fd() const = 0;

  // The arena's parts: part 0 holds the default namespace and every namespace that has
  // no part of its own; a client is passed only the memfds of the parts whose
  // namespaces its grant includes.  One part, the whole arena, unless the DB was opened
  // with namespace_arenas.
  virtual size_t arena_part_count() const = 0;
  virtual Part arena_part(size_t i) const = 0;
  // The part holding namespace `namespace_id`'s values (0: the default namespace).
  virtual uint32_t ArenaPartOf(uint64_t namespace_id) const = 0;

  // Reserves room for a value of `size` bytes in the arena, invisible to every reader,
  // evicting as a put would.  `key` is the key whose value the room is for, checked as
  // a put's key and size are.  The room is charged to key's namespace from now until it
  // is committed or given back: NoSpace naming the namespace and its quota when it would
  // take the namespace past its memory quota and none of the namespace's own values can
  // be evicted for it (MemoryTier::Reserve).  A failure counts as a failed put.  Giving
  // up the reservation (destroying it) gives the room back, and the charge.
  virtual Status Reserve(const Slice& key, uint64_t size, MemoryTier::Reservation* reservation) = 0;

  // Reserve of a spare slot, before the key of the put that will fill it is known:
  // charged to namespace `namespace_id` (0: the default namespace), and refused rather
  // than evict any of that namespace's values for its quota (a spare may never be
  // used).  Not counted as a failed put.
  virtual Status ReserveSpare(uint64_t namespace_id, uint64_t size,
                              MemoryTier::Reservation* reservation) = 0;

  // Publishes reservations the caller filled, slots[i] under keys[i], as a put of their
  // bytes would be published by the layer this arena belongs to: by the engine exactly
  // as a local put (keys and sizes checked -- a spare's key is seen here first --, a new
  // version, SSD write-through or the retirement of older SSD copies, counters); by a
  // cluster router to each key's owners, as its BatchPut.  (*results)[i] is 0 or the
  // error code of keys[i]'s put (a key fails alone).  A slot published in place is
  // consumed; every other (its key failed, or another host took the bytes) is left to
  // the caller, who gives it back by destroying it.  REQUIRES: keys.size() ==
  // slots.size(), every slot valid and filled.
  virtual void Commit(std::span<const Slice> keys, std::span<MemoryTier::Reservation* const> slots,
                      std::vector<int64_t>* results) = 0;

  // Pins key's value where it is in the memory tier into *handle, counted as a get
  // served from memory: its bytes stay unchanged until the handle is released.
  // NotFound when the memory tier does not hold it (the caller reads it through the DB
  // instead); BufferTooSmall, nothing pinned, when it is larger than `capacity`.
  virtual Status PinInMemory(const Slice& key, uint64_t capacity, MemoryTier::Handle* handle) = 0;
};

// A SharedArena over another one that forwards every call to it: a layer of the owner's
// stack derives from it and overrides what it changes (ClusterDB: Commit).
class StackableArena : public SharedArena {
 public:
  // `below` (not owned) must be set, by the constructor or SetArenaBelow, before any call.
  explicit StackableArena(SharedArena* below = nullptr) : below_(below) {}
  void SetArenaBelow(SharedArena* below) { below_ = below; }
  SharedArena* arena_below() const { return below_; }

  char* arena_base() const override { return below_->arena_base(); }
  uint64_t arena_size() const override { return below_->arena_size(); }
  int arena_fd() const override { return below_->arena_fd(); }
  size_t arena_part_count() const override { return below_->arena_part_count(); }
  Part arena_part(size_t i) const override { return below_->arena_part(i); }
  uint32_t ArenaPartOf(uint64_t namespace_id) const override {
    return below_->ArenaPartOf(namespace_id);
  }
  Status Reserve(const Slice& key, uint64_t size, MemoryTier::Reservation* reservation) override {
    return below_->Reserve(key, size, reservation);
  }
  Status ReserveSpare(uint64_t namespace_id, uint64_t size,
                      MemoryTier::Reservation* reservation) override {
    return below_->ReserveSpare(namespace_id, size, reservation);
  }
  void Commit(std::span<const Slice> keys, std::span<MemoryTier::Reservation* const> slots,
              std::vector<int64_t>* results) override {
    below_->Commit(keys, slots, results);
  }
  Status PinInMemory(const Slice& key, uint64_t capacity, MemoryTier::Handle* handle) override {
    return below_->PinInMemory(key, capacity, handle);
  }

 private:
  SharedArena* below_;
};

}  // namespace kvengine

#endif  // KVENGINE_DB_SHARED_ARENA_H_
