#include "attach/owner_db.h"

#include <filesystem>

#include "attach/local_server.h"
#include "attach/local_socket_record.h"

namespace kvengine {

std::string OwnerDB::AbsoluteSocketPath(const std::string& path) {
  std::error_code ec;
  return std::filesystem::absolute(path, ec).string();
}

Status OwnerDB::Wrap(const Options& options, const std::string& path, SharedArena* arena,
                     Logger* logger, std::unique_ptr<DB>* db) {
  Env* env = options.env != nullptr ? options.env : Env::Default();
  std::unique_ptr<OwnerDB> owner(new OwnerDB(std::move(*db), env, path));
  // Nobody else knows the OwnerDB yet; the lock is for the analysis' sake.
  MutexLock closing(&owner->close_mu_);
  // The server serves the OwnerDB itself, the top of the stack: a client's property
  // reports the local counters too, as the owner's own does.
  Status s =
      LocalServer::Start(options, owner.get(), arena, logger, &owner->counters_, &owner->server_);
  if (s.ok()) s = WriteLocalSocketRecord(env, path, options.local_listen);
  if (!s.ok()) {
    if (owner->server_ != nullptr) {
      owner->server_->Stop();
      owner->server_.reset();
      RemoveLocalSocketRecord(env, path);
    }
    *db = std::move(owner->base_);
    return s;
  }
  closing.Unlock();
  *db = std::move(owner);
  return Status::OK();
}

OwnerDB::OwnerDB(std::unique_ptr<DB> served, Env* env, std::string path)
    : StackableDB(std::move(served)), env_(env), path_(std::move(path)) {}

OwnerDB::~OwnerDB() { Close(); }

Status OwnerDB::Close() {
  MutexLock closing(&close_mu_);
  // Attached clients go first: their sessions hold reservations and pins in the arena,
  // and call the DB served.
  if (server_ != nullptr) {
    server_->Stop();
    server_.reset();
    RemoveLocalSocketRecord(env_, path_);
  }
  return base_ != nullptr ? base_->Close() : Status::OK();
}

bool OwnerDB::GetProperty(const std::string& name, std::string* value) {
  if (!base_->GetProperty(name, value)) return false;
  if (name == "kvengine.stats") {
    counters_.AppendText(value);
  } else if (name == "kvengine.stats.json") {
    counters_.AddToJson(value);
  } else if (name == "kvengine.stats.prometheus" || name == "kvengine.prometheus" ||
             name == "kvengine.metrics") {
    counters_.AppendPrometheus(value);
  }
  return true;
}

}  // namespace kvengine
