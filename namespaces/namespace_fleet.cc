#include "namespaces/namespace_fleet.h"

#include <chrono>
#include <utility>

#include "util/coding.h"
#include "util/hash.h"

namespace kvengine {

namespace {

// DO NOT CHANGE: part of the peer protocol (docs/transport.md, SYNC_NAMESPACES).
enum RequestKind : uint8_t { kPull = 0, kPush = 1 };
constexpr uint8_t kAnswerHasRegistry = 1;
constexpr uint8_t kAnswerMayChange = 2;

std::string Request(RequestKind kind, uint64_t digest, std::string_view registry) {
  std::string out;
  out.push_back(static_cast<char>(kind));
  PutFixed64(&out, digest);
  out.append(registry);
  return out;
}

}  // namespace

NamespaceFleet::NamespaceFleet(NamespacePeers peers, Registry* registry, Logger* log)
    : peers_(std::move(peers)), registry_(registry), log_(log) {
  if (peers_.serve) {
    peers_.serve([this](bool may_change, const std::function<bool(uint64_t)>& visible,
                        std::string_view request, std::string* answer) {
      return Serve(may_change, visible, request, answer);
    });
  }
}

NamespaceFleet::~NamespaceFleet() { Stop(); }

void NamespaceFleet::Start() {
  puller_ = std::thread([this] { Loop(); });
}

void NamespaceFleet::Stop() {
  {
    MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = stopping_ = true;
  }
  wake_.NotifyAll();
  if (peers_.serve) peers_.serve(NamespaceSyncFn());
  if (puller_.joinable()) puller_.join();
}

void NamespaceFleet::Log(LogLevel level, const std::string& line) {
  if (log_ != nullptr && log_->Enabled(level)) log_->Write(level, line);
}

void NamespaceFleet::Loop() {
  for (;;) {
    ForEachMember([this](const std::string& member) {
      bool may_change = false;
      return PullFrom(member, true, &may_change);
    });
    MutexLock l(&mu_);
    if (!stopping_) wake_.WaitFor(&mu_, std::chrono::milliseconds(kPullIntervalMs));
    if (stopping_) return;
  }
}

Status NamespaceFleet::ForEachMember(const std::function<Status(const std::string&)>& fn) {
  const std::vector<std::string> members = peers_.members();
  std::vector<Status> results(members.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < members.size(); i++) {
    threads.emplace_back([&, i] { results[i] = fn(members[i]); });
  }
  for (std::thread& t : threads) t.join();
  for (const Status& s : results) {
    if (!s.ok() && !s.IsIOError()) return s;
  }
  return Status::OK();
}

Status NamespaceFleet::PullFrom(const std::string& member, bool push_back, bool* may_change) {
  const std::string mine = EncodeNamespaceRegistry(registry_->Snapshot());
  std::string answer;
  Status s = peers_.call(member, Request(kPull, Hash64(mine), ""), &answer);
  if (!s.ok()) return s;
  if (answer.empty()) return Status::Corruption("member " + member, "empty SYNC_NAMESPACES answer");
  const auto bits = static_cast<uint8_t>(answer[0]);
  *may_change = (bits & kAnswerMayChange) != 0;
  if ((bits & kAnswerHasRegistry) == 0) return Status::OK();  // the same registry
  const std::string_view theirs = std::string_view(answer).substr(1);
  NamespaceRecords records;
  s = DecodeNamespaceRegistry(theirs, "of member " + member, &records);
  if (s.ok()) s = registry_->Merge(records, member);
  if (!s.ok()) {
    Log(LogLevel::kWarn,
        "namespaces: merging the registry of member " + member + ": " + s.ToString());
    return s;
  }
  if (!push_back || !*may_change) return Status::OK();
  // The member lacks something this DB has (it missed a push): send it.
  const std::string merged = EncodeNamespaceRegistry(registry_->Snapshot());
  return Hash64(merged) == Hash64(theirs) ? Status::OK() : PushTo(member, merged);
}

Status NamespaceFleet::PushTo(const std::string& member, const std::string& registry) {
  std::string answer;
  Status s = peers_.call(member, Request(kPush, Hash64(registry), registry), &answer);
  if (!s.ok()) {
    Log(s.IsIOError() ? LogLevel::kInfo : LogLevel::kWarn,
        "namespaces: member " + member + " did not take this registry (" + s.ToString() +
            "); it catches up on its next pull");
  }
  return s;
}

Status NamespaceFleet::PullAll() {
  return ForEachMember([this](const std::string& member) {
    bool may_change = false;
    Status s = PullFrom(member, false, &may_change);
    if (s.ok() && !may_change) {
      return Status::PermissionDenied("member " + member,
                                      "this DB's token may not create or drop namespaces "
                                      "(a tenant bound to namespaces; use a '*' tenant)");
    }
    return s;
  });
}

Status NamespaceFleet::PushAll() {
  const std::string mine = EncodeNamespaceRegistry(registry_->Snapshot());
  return ForEachMember([&](const std::string& member) { return PushTo(member, mine); });
}

Status NamespaceFleet::Serve(bool may_change, const std::function<bool(uint64_t)>& visible,
                             std::string_view request, std::string* answer) {
  uint64_t digest = 0;
  if (request.empty()) return Status::InvalidArgument("empty SYNC_NAMESPACES request");
  const auto kind = static_cast<uint8_t>(request[0]);
  request.remove_prefix(1);
  if ((kind != kPull && kind != kPush) || !GetFixed64(&request, &digest) ||
      (kind == kPull && !request.empty())) {
    return Status::InvalidArgument("malformed SYNC_NAMESPACES request");
  }
  if (kind == kPush) {
    if (!may_change) {
      return Status::PermissionDenied(
          "a tenant bound to namespaces may not create or drop namespaces");
    }
    NamespaceRecords records;
    Status s = DecodeNamespaceRegistry(request, "sent by a peer", &records);
    if (s.ok()) s = registry_->Merge(records, "a peer's push");
    if (!s.ok()) return s;
  }
  NamespaceRecords mine = registry_->Snapshot();
  std::erase_if(mine, [&](const NamespaceRecord& r) { return !visible(r.info.id); });
  const std::string encoded = EncodeNamespaceRegistry(mine);
  const bool same = Hash64(encoded) == digest;
  answer->clear();
  answer->push_back(
      static_cast<char>((same ? 0 : kAnswerHasRegistry) | (may_change ? kAnswerMayChange : 0)));
  if (!same) answer->append(encoded);
  return Status::OK();
}

}  // namespace kvengine
