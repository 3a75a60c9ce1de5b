// The slab allocator and the memory tier: placement, LRU eviction, pinning, accounting.
#include "db/memory_tier.h"

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "db/key_arena.h"
#include "db/key_index.h"
#include "db/namespace_tags.h"
#include "db/namespace_usage.h"
#include "db/slab_allocator.h"
#include "gtest/gtest.h"
#include "test/test_util.h"
#include "util/hash.h"
#include "util/logging.h"
#include "util/namespace_key.h"

namespace kvengine {
namespace {

constexpr uint64_t kSlab = 64 << 10;

// Erases every key of the tier that pred holds for, as DBImpl::DeleteMatching does: the
// keys copied shard by shard, matched with no lock held, then erased one by one.
uint64_t EraseIf(MemoryTier* tier, const std::function<bool(std::string_view)>& pred) {
  uint64_t erased = 0;
  std::vector<std::string> keys;
  for (size_t shard = 0; shard < tier->shard_count(); shard++) {
    keys.clear();
    tier->CopyKeys(shard, &keys);
    for (const std::string& key : keys) erased += pred(key) && tier->Erase(key);
  }
  return erased;
}

class MemoryTierTest : public ::testing::Test {
 protected:
  void Open(uint64_t capacity, MemoryEviction eviction = MemoryEviction::kLru) {
    Options o;
    o.memory_capacity_bytes = capacity;
    o.memory_slab_size = kSlab;
    o.memory_eviction = eviction;
    o.index_shards = 4;
    ASSERT_TRUE(o.Validate().ok());
    ASSERT_TRUE(MemoryTier::Create(o, &logger_, &versions_, &tier_).ok());
  }
  Status Put(const std::string& key, const std::string& value) {
    Slice part(value);
    return tier_->Put(key, std::span<const Slice>(&part, 1), value.size(), nullptr);
  }
  std::string Get(const std::string& key) {
    MemoryTier::Handle h;
    if (!tier_->Lookup(key, &h)) return "<absent>";
    return h.value().ToString();
  }
  // Keys k0..k<n-1>; all but every third (k0, k3, ...) are stored, with value v<i>.
  std::vector<std::string> PutAllButEveryThird(int n) {
    std::vector<std::string> names;
    for (int i = 0; i < n; i++) {
      names.push_back("k" + std::to_string(i));
      if (i % 3 != 0) {
        EXPECT_TRUE(Put(names.back(), "v" + std::to_string(i)).ok());
      }
    }
    return names;
  }

  // Defined with the namespace tests below.
  void CheckNamespacedKeysBesideDefaultOnes(uint64_t id_a, uint64_t id_b);

  Logger logger_;
  std::atomic<uint64_t> versions_{0};
  std::unique_ptr<MemoryTier> tier_;
};

TEST(SlabAllocatorTest, ClassesAlignAndFit) {
  std::vector<char> backing(8 * kSlab + 4096);
  char* base =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(backing.data()) + 4095) & ~4095ull);
  SlabAllocator a(base, 8 * kSlab, kSlab);
  EXPECT_EQ(a.capacity(), 8 * kSlab);
  EXPECT_EQ(a.AllocationSize(16 << 10), 16u << 10);  // powers of two are exact classes
  EXPECT_EQ(a.AllocationSize(1), 256u);
  EXPECT_EQ(a.AllocationSize(kSlab + 1), 2 * kSlab);
  for (uint64_t size : {uint64_t{1}, uint64_t{300}, uint64_t{5000}, uint64_t{20000}, kSlab}) {
    EXPECT_GE(a.AllocationSize(size), size);
    EXPECT_LE(a.AllocationSize(size), std::max<uint64_t>(256, size + size / 4 + 4096));
  }
  Item* item = a.Allocate(8192);
  ASSERT_NE(item, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.DataOf(item)) % 4096, 0u);
  EXPECT_EQ(a.allocated_bytes(), 8192u);
  EXPECT_EQ(a.free_slab_count(), 7u);
  a.Free(item);
  EXPECT_EQ(a.allocated_bytes(), 0u);
  EXPECT_EQ(a.free_slab_count(), 8u);  // an empty slab goes back to the pool
}

TEST(SlabAllocatorTest, RunsOfSlabsForLargeValues) {
  std::vector<char> backing(8 * kSlab + 4096);
  char* base =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(backing.data()) + 4095) & ~4095ull);
  SlabAllocator a(base, 8 * kSlab, kSlab);
  Item* big = a.Allocate(3 * kSlab);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(a.free_slab_count(), 5u);
  Item* too_big = a.Allocate(6 * kSlab);
  EXPECT_EQ(too_big, nullptr);
  a.Free(big);
  EXPECT_EQ(a.free_slab_count(), 8u);
}

// Every key length up to the pooled limit takes the smallest class that holds it, the
// classes are 8-byte multiples, and beyond 64 bytes less than a fifth of a block is unused.
TEST(KeyArenaTest, ClassesFitKeysTightly) {
  for (size_t size = 1; size <= KeyArena::kMaxPooledKey; size++) {
    const int cls = KeyArena::ClassOf(size);
    const size_t block = KeyArena::ClassSize(cls);
    ASSERT_GE(block, size) << size;
    ASSERT_EQ(block % 8, 0u) << size;
    if (cls > 0) {
      ASSERT_LT(KeyArena::ClassSize(cls - 1), size) << size;
    }
    if (size > 64) {
      ASSERT_LT((block - size) * 5, block) << size;
    }
  }
  KeyArena arena;
  char* a = arena.Allocate(16);
  char* b = arena.Allocate(KeyArena::kMaxPooledKey + 1);  // from the heap
  EXPECT_EQ(arena.Allocate(0), nullptr);
  std::memset(a, 'a', 16);
  std::memset(b, 'b', KeyArena::kMaxPooledKey + 1);
  EXPECT_EQ(arena.mapped_bytes(), 2u << 20);
  arena.Free(a, 16);
  arena.Free(b, KeyArena::kMaxPooledKey + 1);
  arena.Free(nullptr, 0);
}

// The open-addressing index against a std::map, with hashes forced into few home slots
// so that runs wrap around the table's end and deletions shift members back.
TEST(KeyIndexTest, MatchesAMapUnderRandomInsertsAndErases) {
  std::vector<Item> items(2000);
  std::vector<std::string> keys(items.size());  // the items' key bytes
  for (size_t i = 0; i < items.size(); i++) {
    keys[i] = "key-" + std::to_string(i);
    items[i].SetKeyBytes(keys[i], nullptr);  // short keys: all in the item
  }
  for (uint64_t hash_bits : {uint64_t{64}, uint64_t{3}}) {
    // hash_bits 3: eight distinct hashes in all, each the top bits of a home slot.
    auto hash_of = [hash_bits](const Item& item) {
      const uint64_t h = Hash64(item.KeyString());
      return hash_bits == 64 ? h : (h >> 61) << 61 | (h & 7);
    };
    KeyIndex index;
    std::map<size_t, bool> model;  // item number -> indexed
    std::mt19937_64 rng(7);
    for (int step = 0; step < 20000; step++) {
      const size_t i = rng() % (hash_bits == 64 ? items.size() : 200);
      Item& item = items[i];
      const uint64_t h = hash_of(item);
      if (model[i]) {
        ASSERT_EQ(index.Find(item.KeyString(), h), &item);
        ASSERT_TRUE(index.Contains(h, &item));
        index.Erase(h, &item);
        model[i] = false;
      } else {
        ASSERT_EQ(index.Find(item.KeyString(), h), nullptr);
        ASSERT_FALSE(index.Contains(h, &item));
        index.Insert(h, &item);
        model[i] = true;
      }
      if (step % 997 == 0) {
        size_t n = 0;
        for (const auto& [j, in] : model) {
          n += in;
          ASSERT_EQ(index.Find(items[j].KeyString(), hash_of(items[j])), in ? &items[j] : nullptr)
              << j;
        }
        ASSERT_EQ(index.size(), n);
        size_t seen = 0;
        index.ForEach([&](Item* item, uint64_t h) {
          EXPECT_EQ(h, hash_of(*item));
          seen++;
        });
        ASSERT_EQ(seen, n);
      }
    }
  }
}

// A put prefetches its slot without the shard's lock, from a hint the index keeps: the
// hint must follow the table through every growth, or the prefetch fetches freed memory.
TEST(KeyIndexTest, TheUnlockedHintFollowsTheTableAsItGrows) {
  std::vector<Item> items(5000);
  KeyIndex index;
  std::mt19937_64 rng(11);
  size_t grown = 0;
  size_t bytes = index.bytes();
  for (Item& item : items) {
    index.Insert(rng(), &item);
    if (index.bytes() != bytes) {
      bytes = index.bytes();
      grown++;
    }
    for (int probe = 0; probe < 4; probe++) {
      const uint64_t h = rng();
      ASSERT_EQ(index.HintedHome(h), index.HomeAddress(h)) << "after " << index.size() << " keys";
    }
  }
  EXPECT_GE(grown, 3u);  // the check ran across several tables
}

TEST_F(MemoryTierTest, BatchContainsAgreesWithContains) {
  Open(64 * kSlab);
  std::vector<std::string> names = PutAllButEveryThird(300);
  names.push_back("");  // never indexed
  std::vector<Slice> keys(names.begin(), names.end());
  keys.push_back(
      Slice(static_cast<const char*>(nullptr), 5));  // looked up as the empty key: absent
  std::vector<uint8_t> found;
  tier_->BatchContains(keys, &found);
  ASSERT_EQ(found.size(), keys.size());
  for (size_t i = 0; i + 1 < keys.size(); i++) {
    EXPECT_EQ(found[i] != 0, tier_->Contains(keys[i])) << names[i];
    if (i < 300) {
      EXPECT_EQ(found[i] != 0, i % 3 != 0) << names[i];
    }
  }
  EXPECT_EQ(found.back(), 0);
  for (size_t i : {size_t{0}, size_t{1}, size_t{2}, keys.size() - 1}) {  // batches of one
    tier_->BatchContains(std::span<const Slice>(&keys[i], 1), &found);
    ASSERT_EQ(found.size(), 1u);
    EXPECT_EQ(found[0] != 0, i == 1 || i == 2) << i;
  }
  tier_->BatchContains({}, &found);
  EXPECT_TRUE(found.empty());
}

// Keys' bytes are given back on overwrite, delete and eviction: churn through many times
// the keys the tier holds, of lengths in four size classes and one too long for them,
// and the keys' RAM stays within a chunk a class of what the first fill took; with every
// key gone, only the classes' spare chunks remain.
TEST_F(MemoryTierTest, KeyBytesDoNotGrowUnderChurn) {
  Open(64 * kSlab);  // 256-byte slots: 16384 values at most
  const size_t lengths[] = {12, 40, 100, 300, 5000};
  auto key = [&lengths](uint64_t i) {
    std::string k = "key-" + std::to_string(i) + "-";
    k.resize(lengths[i % 5], 'k');
    return k;
  };
  const std::string value(200, 'v');
  uint64_t next = 0;
  for (; next < 20000; next++) ASSERT_TRUE(Put(key(next), value).ok());
  const auto filled = tier_->GetStats();
  ASSERT_GT(filled.evictions, 0u);
  ASSERT_GT(filled.key_arena_bytes, 0u);
  const uint64_t bound = filled.key_arena_bytes + 4 * (2u << 20);

  std::mt19937_64 rng(3);
  for (int op = 0; op < 200000; op++) {
    const uint64_t old = next - 1 - rng() % 16000;  // mostly still held
    switch (rng() % 3) {
      case 0:
        ASSERT_TRUE(Put(key(old), value).ok());  // an overwrite
        break;
      case 1:
        tier_->Erase(key(old));
        break;
      default:
        ASSERT_TRUE(Put(key(next++), value).ok());  // evicts once the tier is full
    }
    if (op % 10000 == 0) {
      ASSERT_LE(tier_->GetStats().key_arena_bytes, bound) << op;
    }
  }
  const auto churned = tier_->GetStats();
  EXPECT_LE(churned.key_arena_bytes, bound);
  EXPECT_GT(churned.evictions, filled.evictions + 10000);

  EXPECT_GT(EraseIf(tier_.get(), [](std::string_view) { return true; }), 0u);
  EXPECT_EQ(tier_->GetStats().items, 0u);
  EXPECT_LE(tier_->GetStats().key_arena_bytes, 4u * (2u << 20));  // one spare per class
  // Left to the tier's destructor: a pooled key and one on the heap (LeakSanitizer).
  ASSERT_TRUE(Put(key(0), value).ok());
  ASSERT_TRUE(Put(key(4), value).ok());
}

// BatchLookup pins what Lookup would find, and a pinned value outlives its overwrite.
TEST_F(MemoryTierTest, BatchLookupAgreesWithLookup) {
  Open(64 * kSlab);
  const std::vector<std::string> names = PutAllButEveryThird(300);
  std::vector<Slice> keys(names.begin(), names.end());
  keys.push_back(Slice(static_cast<const char*>(nullptr), 5));  // the empty key: absent
  std::vector<MemoryTier::Handle> handles;
  tier_->BatchLookup(keys, &handles);
  ASSERT_EQ(handles.size(), keys.size());
  for (int i = 0; i < 300; i++) {
    ASSERT_EQ(handles[i].valid(), i % 3 != 0) << i;
    if (handles[i].valid()) {
      EXPECT_EQ(handles[i].value().ToString(), "v" + std::to_string(i));
    }
  }
  EXPECT_FALSE(handles.back().valid());
  const auto st = tier_->GetStats();
  EXPECT_EQ(st.lookup_hits, 200u);
  EXPECT_EQ(st.lookup_misses, 101u);

  ASSERT_TRUE(Put("k1", "replaced").ok());
  EXPECT_EQ(handles[1].value().ToString(), "v1");
  EXPECT_EQ(Get("k1"), "replaced");
  handles.clear();
  tier_->BatchLookup({}, &handles);
  EXPECT_TRUE(handles.empty());
}

// An item holds a key's first 16 bytes and a longer key's rest in the key arena
// (db/item.h): keys of every length around that boundary, and keys that differ only
// before or only after it, are told apart by every lookup, and whole keys come back out.
TEST_F(MemoryTierTest, KeysShortAndLongAroundTheItemsKeyRoom) {
  Open(64 * kSlab);
  std::vector<std::string> keys;
  for (size_t len = 0; len <= 40; len++) {
    keys.push_back(std::string(len, 'k'));
    if (len > 0) keys.push_back(std::string(len - 1, 'k') + 'x');  // differs at the end
    if (len > 1) keys.push_back('x' + std::string(len - 1, 'k'));  // differs at the start
  }
  // The empty key is never indexed: the DB rejects it.
  keys.erase(keys.begin());
  for (size_t i = 0; i < keys.size(); i++) {
    ASSERT_TRUE(Put(keys[i], "v" + std::to_string(i)).ok()) << keys[i];
  }
  for (size_t i = 0; i < keys.size(); i++) {
    EXPECT_EQ(Get(keys[i]), "v" + std::to_string(i)) << keys[i];
    EXPECT_TRUE(tier_->Contains(keys[i])) << keys[i];
  }
  EXPECT_EQ(Get(std::string(17, 'y')), "<absent>");
  EXPECT_EQ(Get(std::string(16, 'k') + "z"), "<absent>");  // a stored key's head
  std::vector<Slice> slices(keys.begin(), keys.end());
  slices.push_back(Slice(std::string_view("kkkkkkkkkkkkkkkkkkkz")));
  std::vector<uint8_t> found;
  tier_->BatchContains(slices, &found);
  for (size_t i = 0; i < keys.size(); i++) EXPECT_EQ(found[i], 1) << keys[i];
  EXPECT_EQ(found.back(), 0);
  std::vector<MemoryTier::Handle> handles;
  tier_->BatchLookup(slices, &handles);
  for (size_t i = 0; i < keys.size(); i++) {
    ASSERT_TRUE(handles[i].valid()) << keys[i];
    EXPECT_EQ(handles[i].value().ToString(), "v" + std::to_string(i));
  }
  handles.clear();
  std::set<std::string> seen;
  tier_->ForEach([&](std::string_view k, uint64_t, uint64_t) { seen.insert(std::string(k)); });
  EXPECT_EQ(seen, std::set<std::string>(keys.begin(), keys.end()));
  EXPECT_EQ(EraseIf(tier_.get(), [](std::string_view k) { return k.size() > 16 && k[0] == 'x'; }),
            24u);
  EXPECT_FALSE(tier_->Contains('x' + std::string(19, 'k')));
  EXPECT_TRUE(tier_->Contains('x' + std::string(15, 'k')));
}

TEST_F(MemoryTierTest, PutGetOverwriteErase) {
  Open(16 * kSlab);
  ASSERT_TRUE(Put("a", "alpha").ok());
  ASSERT_TRUE(Put("b", "beta").ok());
  EXPECT_EQ(Get("a"), "alpha");
  ASSERT_TRUE(Put("a", "ALPHA!").ok());
  EXPECT_EQ(Get("a"), "ALPHA!");
  EXPECT_TRUE(tier_->Contains("b"));
  EXPECT_TRUE(tier_->Erase("b"));
  EXPECT_FALSE(tier_->Erase("b"));
  EXPECT_EQ(Get("b"), "<absent>");
  auto st = tier_->GetStats();
  EXPECT_EQ(st.items, 1u);
  EXPECT_EQ(st.value_bytes, 6u);
}

// TryLookup, the peer server poller's pin, never waits for the key's lock: while
// another thread holds it, it gives up at once.
TEST_F(MemoryTierTest, TryLookupDoesNotWaitForTheKeysLock) {
  Open(16 * kSlab);
  ASSERT_TRUE(Put("k", "value").ok());
  MemoryTier::Handle h;
  EXPECT_FALSE(tier_->TryLookup("absent", &h));
  ASSERT_TRUE(tier_->TryLookup("k", &h));
  EXPECT_EQ(h.value().ToString(), "value");
  h.Release();
  bool while_locked = true;
  tier_->WithKeyLocked("k", [&](uint64_t, uint64_t) {
    std::thread other([&] {
      MemoryTier::Handle o;
      while_locked = tier_->TryLookup("k", &o);
    });
    other.join();
  });
  EXPECT_FALSE(while_locked);
  EXPECT_TRUE(tier_->TryLookup("k", &h));
}

TEST_F(MemoryTierTest, VersionsIncrease) {
  Open(16 * kSlab);
  uint64_t v1 = 0, v2 = 0;
  Slice p("x");
  ASSERT_TRUE(tier_->Put("k", std::span<const Slice>(&p, 1), 1, &v1).ok());
  ASSERT_TRUE(tier_->Put("k", std::span<const Slice>(&p, 1), 1, &v2).ok());
  EXPECT_GT(v2, v1);
  MemoryTier::Handle h;
  ASSERT_TRUE(tier_->Lookup("k", &h));
  EXPECT_EQ(h.version(), v2);
}

TEST_F(MemoryTierTest, EvictsLeastRecentlyUsedFirst) {
  Open(1 * kSlab);  // one slab: 4 values of 16 KiB
  const std::string v(16 << 10, 'v');
  for (const char* k : {"k0", "k1", "k2", "k3"}) ASSERT_TRUE(Put(k, v).ok());
  EXPECT_TRUE(Get("k0") == v);  // k0 becomes the hottest; k1 is now the coldest
  ASSERT_TRUE(Put("k4", v).ok());
  EXPECT_EQ(Get("k1"), "<absent>");
  // Reading k0, k2, k3, k4 in this order makes k0 the coldest again.
  for (const char* k : {"k0", "k2", "k3", "k4"}) EXPECT_TRUE(Get(k) == v) << k;
  ASSERT_TRUE(Put("k5", v).ok());
  EXPECT_EQ(Get("k0"), "<absent>");
  EXPECT_TRUE(Get("k2") == v);
  auto st = tier_->GetStats();
  EXPECT_EQ(st.evictions, 2u);
  EXPECT_EQ(st.evicted_bytes, 2u * v.size());
  EXPECT_EQ(st.items, 4u);
}

// Reads of an item relinked in its list's current epoch leave it in place
// (SlabAllocator::Touch), yet what was read stays and what was not goes first.
TEST_F(MemoryTierTest, RepeatedReadsKeepWarmItemsAndEvictColdOnes) {
  Open(1 * kSlab);  // one slab: 16 values of 4 KiB
  const std::string v(4 << 10, 'v');
  for (int i = 0; i < 16; i++) ASSERT_TRUE(Put("k" + std::to_string(i), v).ok());
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 8; i++) EXPECT_TRUE(Get("k" + std::to_string(i)) == v) << i;
  }
  for (int i = 16; i < 24; i++) ASSERT_TRUE(Put("k" + std::to_string(i), v).ok());
  for (int i = 0; i < 8; i++) EXPECT_TRUE(Get("k" + std::to_string(i)) == v) << i;
  for (int i = 8; i < 16; i++) EXPECT_EQ(Get("k" + std::to_string(i)), "<absent>") << i;
  EXPECT_EQ(tier_->GetStats().evictions, 8u);
}

TEST_F(MemoryTierTest, EvictionAcrossSizeClassesReclaimsSlabs) {
  Open(4 * kSlab);
  const std::string small(16 << 10, 's');
  for (int i = 0; i < 16; i++) ASSERT_TRUE(Put("s" + std::to_string(i), small).ok());
  // Every slab now belongs to the 16 KiB class; a 40 KiB value needs a slab reclaimed.
  const std::string mid(40 << 10, 'm');
  ASSERT_TRUE(Put("mid", mid).ok());
  EXPECT_EQ(Get("mid"), mid);
  // A value of two slabs needs a contiguous run.
  const std::string big(2 * kSlab, 'b');
  ASSERT_TRUE(Put("big", big).ok());
  EXPECT_EQ(Get("big"), big);
  EXPECT_GT(tier_->GetStats().evictions, 4u);
}

TEST_F(MemoryTierTest, NoEvictionRejectsWithNoSpace) {
  Open(1 * kSlab, MemoryEviction::kNone);
  const std::string v(16 << 10, 'v');
  for (int i = 0; i < 4; i++) ASSERT_TRUE(Put("k" + std::to_string(i), v).ok());
  Status s = Put("k4", v);
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  EXPECT_NE(s.message().find("memory_eviction=none"), std::string::npos);
  for (int i = 0; i < 4; i++) EXPECT_EQ(Get("k" + std::to_string(i)), v);
  EXPECT_EQ(tier_->GetStats().rejected_puts, 1u);
}

TEST_F(MemoryTierTest, ValueLargerThanArenaIsInvalid) {
  Open(2 * kSlab);
  std::string v(3 * kSlab, 'v');
  EXPECT_TRUE(Put("big", v).IsInvalidArgument());
}

TEST_F(MemoryTierTest, PinnedValueSurvivesOverwriteAndEviction) {
  Open(1 * kSlab);
  const std::string v0(16 << 10, '0');
  ASSERT_TRUE(Put("k", v0).ok());
  MemoryTier::Handle pinned;
  ASSERT_TRUE(tier_->Lookup("k", &pinned));
  ASSERT_TRUE(Put("k", std::string(16 << 10, '1')).ok());  // overwrite
  for (int i = 0; i < 8; i++) {                            // churn the only slab
    ASSERT_TRUE(Put("o" + std::to_string(i), std::string(16 << 10, 'a' + i)).ok());
  }
  EXPECT_EQ(pinned.value().ToString(), v0);  // the reader still sees intact bytes
  pinned.Release();
}

class RefusingHandler : public EvictionHandler {
 public:
  bool OnEvict(const Slice& key, const Slice& value, uint64_t) override {
    offered.insert(key.ToString());
    bytes += value.size();
    return accept;
  }
  bool accept = true;
  std::set<std::string> offered;
  uint64_t bytes = 0;
};

TEST_F(MemoryTierTest, EvictionHandlerSeesValuesAndMayRefuse) {
  Open(1 * kSlab);
  RefusingHandler handler;
  tier_->SetEvictionHandler(&handler);
  const std::string v(16 << 10, 'v');
  for (int i = 0; i < 4; i++) ASSERT_TRUE(Put("k" + std::to_string(i), v).ok());
  ASSERT_TRUE(Put("k4", v).ok());
  EXPECT_EQ(handler.offered.count("k0"), 1u);
  EXPECT_EQ(handler.bytes, v.size());
  handler.accept = false;
  Status s = Put("k5", v);
  EXPECT_TRUE(s.IsNoSpace()) << s.ToString();
  for (int i = 1; i <= 4; i++) EXPECT_EQ(Get("k" + std::to_string(i)), v);
  EXPECT_GT(tier_->GetStats().eviction_refusals, 0u);
}

// The same user keys of 1 to 40 bytes in the default namespace and in namespaces a and
// b: a namespace's items store the user part beside a tag (db/item.h), or the whole key
// when no tag is left, and either way every call tells the three apart, hands back
// whole keys (ForEach, CopyKeys, the eviction handler) and charges the right namespace.
void MemoryTierTest::CheckNamespacedKeysBesideDefaultOnes(uint64_t id_a, uint64_t id_b) {
  const uint64_t capacity = 16 * kSlab;  // 4096 values of the smallest class
  Open(capacity);
  MemoryTier* tier = tier_.get();
  NamespaceUsage usage(capacity);
  tier->SetNamespaceUsage(&usage);
  RefusingHandler evicted;
  tier->SetEvictionHandler(&evicted);
  const std::string prefix[3] = {"", ns::Prefix(id_a), ns::Prefix(id_b)};
  NamespaceUsage::Slot* slot[3] = {usage.default_slot(), usage.OfId(id_a), usage.OfId(id_b)};
  auto user = [](size_t len) {
    std::string k(len, 'a');
    for (size_t i = 0; i < len; i++) k[i] = static_cast<char>('a' + (i * 7 + len) % 26);
    return k;
  };
  std::map<std::string, std::string> held;  // what the tier must hold
  uint64_t bytes[3] = {};
  auto put = [&](int s, const std::string& key, std::string value) {
    ASSERT_TRUE(Put(key, value).ok()) << s << " " << key.size();
    auto [it, fresh] = held.try_emplace(key, value);
    if (!fresh) bytes[s] -= it->second.size();
    it->second = std::move(value);
    bytes[s] += it->second.size();
  };
  auto check = [&](const char* phase) {
    SCOPED_TRACE(phase);
    for (const auto& [key, value] : held) ASSERT_EQ(Get(key), value) << key.size();
    std::set<std::string> seen;
    tier->ForEach([&](std::string_view k, uint64_t, uint64_t) { seen.insert(std::string(k)); });
    EXPECT_EQ(seen.size(), held.size());
    for (const auto& [key, value] : held) EXPECT_EQ(seen.count(key), 1u) << key.size();
    for (int s = 0; s < 3; s++) EXPECT_EQ(slot[s]->bytes.load(), bytes[s]) << "namespace " << s;
  };
  for (int s = 0; s < 3; s++) {
    for (size_t len = 1; len <= 40; len++) {
      put(s, prefix[s] + user(len), std::string(len + 50 * s, static_cast<char>('0' + s)));
    }
  }
  check("put");
  const std::string other = ns::Prefix(ns::IdOf("never-stored"));
  for (size_t len = 1; len <= 40; len++) {
    EXPECT_EQ(Get(other + user(len)), "<absent>");
    EXPECT_EQ(Get(prefix[1] + user(len) + "x"), "<absent>");
    EXPECT_EQ(Get(prefix[2] + user(len).substr(1)), "<absent>");
  }
  for (size_t len = 1; len <= 40; len++) put(1, prefix[1] + user(len), "a new value");
  check("overwrite");
  for (size_t len = 1; len <= 40; len += 2) {
    EXPECT_TRUE(tier->Erase(prefix[2] + user(len)));
    bytes[2] -= held[prefix[2] + user(len)].size();
    held.erase(prefix[2] + user(len));
  }
  check("erase");
  EXPECT_EQ(EraseIf(tier, [&](std::string_view k) { return k.starts_with(prefix[1]); }), 40u);
  std::erase_if(held, [&](const auto& kv) { return kv.first.starts_with(prefix[1]); });
  bytes[1] = 0;
  check("erase_if");
  // Eviction hashes each victim's key again (MemoryTier::Evict): b's new keys push the
  // others out, and the handler is offered whole keys the tier held.
  std::set<std::string> ever;
  for (const auto& [key, value] : held) ever.insert(key);
  const std::string value(200, 'e');
  for (int i = 0; i < 6000; i++) {
    const std::string key = prefix[2] + "evict-" + std::to_string(i);
    ever.insert(key);
    ASSERT_TRUE(Put(key, value).ok()) << i;
  }
  EXPECT_GE(evicted.offered.size(), 1900u);
  for (const std::string& key : evicted.offered) {
    ASSERT_EQ(ever.count(key), 1u) << "offered a key never stored";
    EXPECT_EQ(Get(key), "<absent>");
  }
  uint64_t items = 0;
  tier->ForEach([&](std::string_view k, uint64_t, uint64_t) {
    items++;
    EXPECT_EQ(ever.count(std::string(k)), 1u);
  });
  EXPECT_EQ(tier->GetStats().items, items);
  uint64_t charged = 0, charged_bytes = 0;
  for (int s = 0; s < 3; s++) {
    charged += slot[s]->items.load();
    charged_bytes += slot[s]->bytes.load();
  }
  EXPECT_EQ(charged, items);
  EXPECT_EQ(charged_bytes, tier->GetStats().value_bytes);
  EXPECT_EQ(EraseIf(tier, [](std::string_view) { return true; }), items);
  for (int s = 0; s < 3; s++) EXPECT_EQ(slot[s]->bytes.load(), 0u) << "namespace " << s;
  tier_.reset();  // before `usage` and `evicted`
}

TEST_F(MemoryTierTest, NamespacedKeysOfEveryLengthBesideDefaultOnes) {
  CheckNamespacedKeysBesideDefaultOnes(ns::IdOf("mixed-a"), ns::IdOf("mixed-b"));
  EXPECT_NE(NamespaceTags::Global().Intern(ns::IdOf("mixed-a")), 0);  // they were tagged
}

// With the process's tag table full, a new namespace's keys are stored whole (the
// layout of every key before tags) and everything above holds the same.  The table is
// filled in a child process, so that no other test sees it full.
TEST_F(MemoryTierTest, NamespacedKeysWithoutATagStayCorrect) {
  auto child = [this] {
    NamespaceTags& tags = NamespaceTags::Global();
    std::mt19937_64 rng(9);
    while (tags.size() < NamespaceTags::kMaxTags) tags.Intern(rng());
    const uint64_t a = ns::IdOf("untagged-a"), b = ns::IdOf("untagged-b");
    if (tags.Intern(a) != 0 || tags.Intern(b) != 0) std::exit(2);
    CheckNamespacedKeysBesideDefaultOnes(a, b);
    std::exit(::testing::Test::HasFailure() ? 1 : 0);
  };
  EXPECT_EXIT(child(), ::testing::ExitedWithCode(0), "");
}

// A namespace costs no key RAM (db/item.h): the same user keys take the same key-arena
// and index bytes in a namespace as in the default namespace, at every key size around
// the item's 16 bytes of key room.  (Stored whole, a 16-byte user key's 25 bytes took an
// arena block each.)
TEST_F(MemoryTierTest, ANamespaceTakesTheKeyRamOfTheDefaultNamespace) {
  const std::string prefix = ns::Prefix(ns::IdOf("key-ram"));
  for (size_t len : {7, 8, 16, 17, 32, 40}) {
    MemoryTier::Stats stats[2];
    for (int in_namespace = 0; in_namespace < 2; in_namespace++) {
      Open(64 * kSlab);
      for (int i = 0; i < 5000; i++) {
        std::string user = std::to_string(i);
        user.resize(len, '.');
        ASSERT_TRUE(Put((in_namespace ? prefix : "") + user, "v").ok());
      }
      stats[in_namespace] = tier_->GetStats();
      ASSERT_EQ(stats[in_namespace].items, 5000u);
      tier_.reset();
    }
    EXPECT_EQ(stats[1].key_arena_bytes, stats[0].key_arena_bytes) << len << "-byte keys";
    EXPECT_EQ(stats[1].index_bytes, stats[0].index_bytes) << len << "-byte keys";
  }
}

TEST_F(MemoryTierTest, CopyKeysAndForEach) {
  Open(16 * kSlab);
  for (int i = 0; i < 10; i++) ASSERT_TRUE(Put("layer." + std::to_string(i), "x").ok());
  ASSERT_TRUE(Put("other", "y").ok());
  uint64_t n = 0;
  tier_->ForEach([&](std::string_view, uint64_t, uint64_t) { n++; });
  EXPECT_EQ(n, 11u);
  EXPECT_EQ(EraseIf(tier_.get(), [](std::string_view k) { return k.starts_with("layer."); }), 10u);
  EXPECT_TRUE(tier_->Contains("other"));
  EXPECT_EQ(tier_->GetStats().items, 1u);
}

TEST_F(MemoryTierTest, ConcurrentPutsAndReadsKeepAccounting) {
  Open(8 * kSlab);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([this, t] {
      std::mt19937_64 rng(t);
      for (int i = 0; i < 2000; i++) {
        std::string key = "k" + std::to_string(rng() % 64);
        if (rng() % 3 == 0) {
          tier_->Erase(key);
        } else if (rng() % 2 == 0) {
          std::string v = test::MakeSelfCheckingValue(rng, 1024 + rng() % (20 << 10));
          Slice p(v);
          EXPECT_TRUE(tier_->Put(key, std::span<const Slice>(&p, 1), v.size(), nullptr).ok());
        } else {
          MemoryTier::Handle h;
          if (tier_->Lookup(key, &h)) {
            EXPECT_TRUE(test::SelfCheck(h.value().data(), h.value().size()));
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  uint64_t items = 0, bytes = 0;
  tier_->ForEach([&](std::string_view, uint64_t size, uint64_t) {
    items++;
    bytes += size;
  });
  auto st = tier_->GetStats();
  EXPECT_EQ(st.items, items);
  EXPECT_EQ(st.value_bytes, bytes);
  EraseIf(tier_.get(), [](std::string_view) { return true; });
  EXPECT_EQ(tier_->GetStats().allocated_bytes, 0u);  // nothing leaked
}

}  // namespace
}  // namespace kvengine
