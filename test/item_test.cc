// The memory tier's Item with namespace tags (db/item.h, db/namespace_tags.h): a key of a
// tagged namespace is stored as its user part and a tag, and still equals exactly its
// whole internal key, comes back whole, and takes no more key RAM than the same user
// key in the default namespace.
#include "db/item.h"

#include <memory>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "db/key_arena.h"
#include "db/namespace_tags.h"
#include "db/namespace_usage.h"
#include "db/slab_allocator.h"
#include "gtest/gtest.h"
#include "util/namespace_key.h"

namespace kvengine {
namespace {

// The user key of `len` bytes used below: distinct per length, never 0xFE-led.
std::string UserKey(size_t len, char fill = 'u') {
  std::string k(len, fill);
  for (size_t i = 0; i < len; i++) k[i] = static_cast<char>(fill + i % 7);
  return k;
}

TEST(NamespaceTagsTest, AnIdKeepsItsTagAndTagsNameTheirIds) {
  auto tags = std::make_unique<NamespaceTags>();
  EXPECT_EQ(tags->Intern(0), 0);  // 0 marks a free slot: never tagged
  EXPECT_EQ(tags->IdOf(0), 0u);
  const uint64_t a = ns::IdOf("a"), b = ns::IdOf("b");
  const uint16_t ta = tags->Intern(a), tb = tags->Intern(b);
  EXPECT_NE(ta, 0);
  EXPECT_NE(tb, 0);
  EXPECT_NE(ta, tb);
  EXPECT_EQ(tags->Intern(a), ta);
  EXPECT_EQ(tags->Intern(b), tb);
  EXPECT_EQ(tags->IdOf(ta), a);
  EXPECT_EQ(tags->IdOf(tb), b);
  EXPECT_EQ(tags->size(), 2u);
  // Ids whose home is slot 0 (tag 0 is "no tag") and ids sharing a home slot.
  const uint16_t t0 = tags->Intern(uint64_t{1} << 16);
  const uint16_t t1 = tags->Intern(uint64_t{2} << 16);
  EXPECT_NE(t0, 0);
  EXPECT_NE(t1, 0);
  EXPECT_NE(t0, t1);
  EXPECT_EQ(tags->IdOf(t0), uint64_t{1} << 16);
  EXPECT_EQ(tags->IdOf(t1), uint64_t{2} << 16);
}

// The id a tagged item compares (db/item.h) is the one the prefix was written with.
TEST(NamespaceTagsTest, APrefixGivesBackItsId) {
  for (uint64_t id : {uint64_t{1}, uint64_t{0x0102030405060708}, ~uint64_t{0},
                      uint64_t{0x8000000000000000}, ns::IdOf("a")}) {
    const std::string prefix = ns::Prefix(id);
    ASSERT_EQ(prefix.size(), ns::kPrefixSize);
    EXPECT_EQ(static_cast<unsigned char>(prefix[0]), ns::kMarker);
    EXPECT_EQ(ns::IdOfKey(prefix + "user"), id);
    EXPECT_EQ(static_cast<unsigned char>(prefix[1]), id >> 56);  // big-endian: key order
  }
}

TEST(NamespaceTagsTest, ThreadsInterningTheSameIdsAgree) {
  auto tags = std::make_unique<NamespaceTags>();
  constexpr int kThreads = 8, kShared = 2000, kOwn = 200;
  std::vector<uint64_t> shared(kShared);
  std::mt19937_64 rng(1);
  for (uint64_t& id : shared) id = rng() | 1;
  std::vector<std::vector<uint16_t>> seen(kThreads, std::vector<uint16_t>(kShared));
  std::vector<std::vector<uint16_t>> own(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      // Each thread its own order of the shared ids, and ids of its own between them.
      std::vector<int> order(kShared);
      for (int i = 0; i < kShared; i++) order[i] = i;
      std::shuffle(order.begin(), order.end(), std::mt19937_64(100 + t));
      for (int i = 0; i < kShared; i++) {
        seen[t][order[i]] = tags->Intern(shared[order[i]]);
        if (i % (kShared / kOwn) == 0) own[t].push_back(tags->Intern((uint64_t(t + 1) << 40) + i));
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint16_t> all;
  for (int i = 0; i < kShared; i++) {
    ASSERT_NE(seen[0][i], 0) << i;
    ASSERT_EQ(tags->IdOf(seen[0][i]), shared[i]) << i;
    for (int t = 1; t < kThreads; t++) ASSERT_EQ(seen[t][i], seen[0][i]) << t << " " << i;
    all.insert(seen[0][i]);
  }
  for (int t = 0; t < kThreads; t++) {
    for (uint16_t tag : own[t]) {
      ASSERT_NE(tag, 0);
      ASSERT_TRUE(all.insert(tag).second) << "tag " << tag << " handed out twice";
    }
  }
  EXPECT_EQ(tags->size(), all.size());
}

TEST(NamespaceTagsTest, AFullTableHandsOutNoTagAndKeepsTheOnesItGave) {
  auto tags = std::make_unique<NamespaceTags>();
  std::mt19937_64 rng(2);
  std::vector<std::pair<uint64_t, uint16_t>> given;
  while (tags->size() < NamespaceTags::kMaxTags) {
    const uint64_t id = rng() | 1;
    if (const uint16_t tag = tags->Intern(id)) given.emplace_back(id, tag);
  }
  EXPECT_EQ(given.size(), NamespaceTags::kMaxTags);
  for (int i = 0; i < 1000; i++) EXPECT_EQ(tags->Intern(rng() | 1), 0);
  EXPECT_EQ(tags->size(), NamespaceTags::kMaxTags);
  for (const auto& [id, tag] : given) {
    ASSERT_EQ(tags->Intern(id), tag);
    ASSERT_EQ(tags->IdOf(tag), id);
  }
  // Ids that all want one slot: the probe gives up after kMaxProbe slots.
  auto crowded = std::make_unique<NamespaceTags>();
  size_t tagged = 0;
  for (uint64_t i = 1; i <= 2 * NamespaceTags::kMaxProbe; i++) {
    tagged += crowded->Intern((i << 16) | 5) != 0;
  }
  EXPECT_EQ(tagged, NamespaceTags::kMaxProbe);
}

class ItemKeyTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSlab = 64 << 10;
  ItemKeyTest() : backing_(4 * kSlab + 4096) {
    char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(backing_.data()) + 4095) &
                                         ~uintptr_t{4095});
    allocator_ = std::make_unique<SlabAllocator>(base, 4 * kSlab, kSlab);
  }
  Item* WithKey(const std::string& key) {
    Item* item = allocator_->Allocate(100);
    EXPECT_NE(item, nullptr);
    allocator_->SetKey(item, key);
    return item;
  }

  std::vector<char> backing_;
  std::unique_ptr<SlabAllocator> allocator_;
};

TEST_F(ItemKeyTest, ATaggedItemEqualsOnlyItsOwnInternalKey) {
  const uint64_t a = ns::IdOf("item-test-a"), b = ns::IdOf("item-test-b");
  for (size_t len = 0; len <= 40; len++) {
    const std::string user = UserKey(len);
    const std::string key = ns::Prefix(a) + user;
    Item* item = WithKey(key);
    SCOPED_TRACE("user key of " + std::to_string(len) + " bytes");
    ASSERT_NE(item->NamespaceTag(), 0);
    EXPECT_EQ(NamespaceTags::Global().IdOf(item->NamespaceTag()), a);
    EXPECT_EQ(item->StoredKeySize(), len);
    EXPECT_EQ(item->KeySize(), key.size());
    // The user part is stored as the same key of the default namespace would be: no
    // arena block up to 16 bytes, the same block beyond.
    EXPECT_EQ(item->KeyRest() == nullptr, len <= Item::kKeyHead);
    EXPECT_EQ(item->KeyString(), key);
    EXPECT_TRUE(item->KeyEquals(key));

    EXPECT_FALSE(item->KeyEquals(ns::Prefix(b) + user));  // another namespace
    EXPECT_FALSE(item->KeyEquals(user));                  // the default namespace
    EXPECT_FALSE(item->KeyEquals(key + "u"));
    EXPECT_FALSE(item->KeyEquals(key.substr(0, key.size() - 1)));
    if (len > 0) {
      EXPECT_FALSE(item->KeyEquals(ns::Prefix(a)));
    }
    std::string other_marker = key;
    other_marker[0] = 'x';  // the prefix's bytes after a byte other than the marker
    EXPECT_FALSE(item->KeyEquals(other_marker));
    // A 0xFE-led key of the same size whose bytes after the marker are the id and the
    // user key shifted: any one byte changed anywhere is another key.
    for (size_t i = 1; i < key.size(); i++) {
      std::string changed = key;
      changed[i] ^= 0x20;
      ASSERT_FALSE(item->KeyEquals(changed)) << "byte " << i;
    }
    // The user key alone, stored in the default namespace, is not the namespaced one.
    Item* plain = WithKey(user);
    EXPECT_EQ(plain->NamespaceTag(), 0);
    EXPECT_TRUE(plain->KeyEquals(user));
    EXPECT_FALSE(plain->KeyEquals(key));
    EXPECT_EQ(plain->KeyString(), user);
    allocator_->Free(plain);
    allocator_->Free(item);
  }
  EXPECT_EQ(allocator_->allocated_bytes(), 0u);
}

// A user key too long for the arena's pools has its rest on the heap: freed through the
// masked pointer by Free, and by the allocator's destructor (LeakSanitizer checks both).
TEST_F(ItemKeyTest, ATaggedKeyWithItsRestOnTheHeap) {
  const std::string key = ns::Prefix(ns::IdOf("item-test-heap")) +
                          UserKey(KeyArena::kMaxPooledKey + Item::kKeyHead + 100);
  Item* freed = WithKey(key);
  Item* kept = WithKey(key + "x");
  for (Item* item : {freed, kept}) {
    ASSERT_NE(item->NamespaceTag(), 0);
    EXPECT_TRUE(Item::Taggable(item->KeyRest()));
    EXPECT_EQ(item->KeyString().size(), item->KeySize());
  }
  EXPECT_TRUE(freed->KeyEquals(key));
  EXPECT_FALSE(freed->KeyEquals(key + "x"));
  EXPECT_TRUE(kept->KeyEquals(key + "x"));
  EXPECT_EQ(kept->KeyString(), key + "x");
  allocator_->Free(freed);
}

TEST_F(ItemKeyTest, KeysThatOnlyLookNamespacedAreStoredWhole) {
  // Shorter than a prefix, or 0xFE-led in a default-looking key: no tag, all bytes kept.
  for (const std::string& key :
       {std::string("\xfe"), std::string("\xfe") + "12345678", std::string(16, '\xfe'),
        std::string("\xfd") + ns::Prefix(ns::IdOf("x")).substr(1) + "user"}) {
    Item* item = WithKey(key);
    if (ns::IsNamespaced(key) && key.size() >= ns::kPrefixSize) {
      EXPECT_NE(item->NamespaceTag(), 0);  // a prefix with any id is a namespace's key
    } else {
      EXPECT_EQ(item->NamespaceTag(), 0);
      EXPECT_EQ(item->StoredKeySize(), key.size());
    }
    EXPECT_EQ(item->KeyString(), key);
    EXPECT_TRUE(item->KeyEquals(key));
    allocator_->Free(item);
  }
}

// NamespaceUsage charges a tagged item by its tag's id, and an untagged one of a
// namespace (stored whole: the layout when no tag is left) by the prefix it starts with.
TEST_F(ItemKeyTest, BothLayoutsOfANamespacesKeyAreChargedToIt) {
  NamespaceUsage usage(1 << 20);
  const uint64_t id = ns::IdOf("item-test-usage");
  const std::string key = ns::Prefix(id) + UserKey(20);
  Item* tagged = WithKey(key);
  ASSERT_NE(tagged->NamespaceTag(), 0);
  EXPECT_EQ(usage.OfItem(*tagged), usage.OfId(id));
  Item untagged;
  std::vector<char> rest(Item::RestSize(key.size()));
  untagged.SetKeyBytes(key, rest.data());
  EXPECT_EQ(untagged.NamespaceTag(), 0);
  EXPECT_EQ(untagged.KeySize(), key.size());
  EXPECT_TRUE(untagged.KeyEquals(key));
  EXPECT_EQ(untagged.KeyString(), key);
  EXPECT_EQ(usage.OfItem(untagged), usage.OfId(id));
  Item plain;
  plain.SetKeyBytes(UserKey(20), rest.data());
  EXPECT_EQ(usage.OfItem(plain), usage.default_slot());
  EXPECT_NE(usage.OfId(id), usage.default_slot());
  allocator_->Free(tagged);
}

// OfId answers from the id's home slot inline, and probes past it otherwise: ids that
// share a home slot keep slots of their own, and id 0 (never a namespace's) is "other".
TEST(NamespaceUsageTest, IdsSharingAHomeSlotKeepSlotsOfTheirOwn) {
  NamespaceUsage usage(1 << 20);
  const uint64_t home = 5;
  std::vector<NamespaceUsage::Slot*> slots;
  for (uint64_t k = 1; k <= 4; k++) slots.push_back(usage.OfId(home + k * NamespaceUsage::kSlots));
  for (size_t i = 0; i < slots.size(); i++) {
    EXPECT_EQ(slots[i]->id.load(), home + (i + 1) * NamespaceUsage::kSlots);
    EXPECT_EQ(usage.OfId(home + (i + 1) * NamespaceUsage::kSlots), slots[i]);  // again: same
    for (size_t j = 0; j < i; j++) EXPECT_NE(slots[i], slots[j]);
  }
  NamespaceUsage::Slot* other = usage.OfId(0);
  EXPECT_EQ(usage.OfId(0), other);
  EXPECT_NE(other, usage.default_slot());
  for (NamespaceUsage::Slot* slot : slots) EXPECT_NE(other, slot);
  EXPECT_EQ(usage.Of(ns::Prefix(home + NamespaceUsage::kSlots) + "k"), slots[0]);
  EXPECT_EQ(usage.Of("k"), usage.default_slot());
}

TEST_F(ItemKeyTest, A16ByteUserKeyTakesNoArenaBlockInANamespace) {
  const std::string prefix = ns::Prefix(ns::IdOf("item-test-ram"));
  std::vector<Item*> items{WithKey("first")};  // the slab's item array, mapped once
  const uint64_t before = allocator_->key_arena_bytes();
  for (int i = 0; i < 200; i++) {
    char user[17];
    std::snprintf(user, sizeof(user), "%016d", i);
    items.push_back(WithKey(prefix + user));
    ASSERT_EQ(items.back()->KeyRest(), nullptr);
    ASSERT_EQ(items.back()->KeyString(), prefix + user);
  }
  EXPECT_EQ(allocator_->key_arena_bytes(), before);
  items.push_back(WithKey(prefix + UserKey(17)));  // the first that needs a block
  EXPECT_GT(allocator_->key_arena_bytes(), before);
  for (Item* item : items) allocator_->Free(item);
}

}  // namespace
}  // namespace kvengine
