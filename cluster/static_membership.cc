// The static membership source: Options::peers, fixed for the life of the DB.
#include "cluster/membership.h"

namespace kvengine {

namespace {

class StaticMembership final : public MembershipSource {
 public:
  explicit StaticMembership(std::vector<Endpoint> members) : members_(std::move(members)) {}

  Status Start(const std::string&, Listener listener) override {
    listener(members_);
    return Status::OK();
  }
  void Stop() override {}
  std::string StatsText() const override { return "membership: static\n"; }

 private:
  const std::vector<Endpoint> members_;
};

}  // namespace

Status NewStaticMembership(const std::string& peers, std::unique_ptr<MembershipSource>* result) {
  std::vector<Endpoint> members;
  Status s = Endpoint::ParseList(peers, &members);
  if (!s.ok()) return Status::InvalidArgument("option peers", s.message());
  *result = std::make_unique<StaticMembership>(std::move(members));
  return Status::OK();
}

}  // namespace kvengine
