#include "src/comm/mesh.hpp"

#include <fmt/format.h>

namespace shardlab {

ParallelDims ParallelDims::resolved(int world) const {
  SHARD_REQUIRE(world >= 1, "the world must hold at least one rank, got {}", world);
  SHARD_REQUIRE(pp >= 1 && tp >= 1 && cp >= 1 && ep >= 1 && dp_replicate >= 0 && dp_shard >= 0,
                "parallel degrees must be positive: --pp {} --dp-replicate {} --dp-shard {} --ep {} --cp {} --tp {}", pp,
                dp_replicate, dp_shard, ep, cp, tp);
  ParallelDims d = *this;
  if (d.dp_replicate == 0 && d.dp_shard == 0) d.dp_replicate = 1;
  const bool shard_left = d.dp_shard == 0, replicate_left = d.dp_replicate == 0;
  if (shard_left || replicate_left) {
    const int fixed = pp * tp * cp * ep * (shard_left ? d.dp_replicate : d.dp_shard);
    SHARD_REQUIRE(world % fixed == 0,
                  "--pp {} x --tp {}{}{} x --{} {} = {} does not divide the world of {} ranks (--{} takes what they leave)",
                  pp, tp, cp > 1 ? fmt::format(" x --cp {}", cp) : "", ep > 1 ? fmt::format(" x --ep {}", ep) : "",
                  shard_left ? "dp-replicate" : "dp-shard",
                  shard_left ? d.dp_replicate : d.dp_shard, fixed, world, shard_left ? "dp-shard" : "dp-replicate");
    (shard_left ? d.dp_shard : d.dp_replicate) = world / fixed;
  }
  SHARD_REQUIRE(d.world() == world,
                "--pp {} x --dp-replicate {} x --dp-shard {}{}{} x --tp {} = {} ranks, but the world has {}", pp,
                d.dp_replicate, d.dp_shard, ep > 1 ? fmt::format(" x --ep {}", ep) : "",
                cp > 1 ? fmt::format(" x --cp {}", cp) : "", tp, d.world(), world);
  return d;
}

int ParallelDims::size(CommAxis a) const {
  int n = 1;
  for (int g = 0; g < kNumGridAxes; ++g)
    if (spans(a, static_cast<GridAxis>(g))) n *= degree(static_cast<GridAxis>(g));
  return n;
}

std::string ParallelDims::describe() const {
  return fmt::format("pp {} x dp_replicate {} x dp_shard {}{}{} x tp {}", pp, dp_replicate, dp_shard,
                     ep > 1 ? fmt::format(" x ep {}", ep) : "", cp > 1 ? fmt::format(" x cp {}", cp) : "", tp);
}

// Ranks are mixed-radix numbers over the grid axes a group spans, the first outermost; the world's
// spans them all.
int MeshCoord::rank_in(CommAxis a, const ParallelDims& d) const {
  int r = 0;
  for (int g = 0; g < kNumGridAxes; ++g)
    if (spans(a, static_cast<GridAxis>(g))) r = r * d.degree(static_cast<GridAxis>(g)) + at(static_cast<GridAxis>(g));
  return r;
}

MeshCoord mesh_coord(const ParallelDims& d, int r) {
  SHARD_CHECK(r >= 0 && r < d.world(), "rank {} outside the mesh {}", r, d.describe());
  MeshCoord c;
  for (int g = kNumGridAxes - 1; g >= 0; --g) {
    const int n = d.degree(static_cast<GridAxis>(g));
    c.at(static_cast<GridAxis>(g)) = r % n;
    r /= n;
  }
  return c;
}

int mesh_rank(const ParallelDims& d, const MeshCoord& c) { return c.rank_in(CommAxis::world, d); }

namespace {
// The group's first member: this rank's coordinates with those along the group set to 0. Ranks of
// one group share it, so it is the group's colour for the split.
int group_color(const ParallelDims& d, MeshCoord c, CommAxis a) {
  for (int g = 0; g < kNumGridAxes; ++g)
    if (spans(a, static_cast<GridAxis>(g))) c.at(static_cast<GridAxis>(g)) = 0;
  return mesh_rank(d, c);
}
}  // namespace

// The world ranks of this rank's group along a grid axis group, in group rank order.
static std::vector<int> group_members(const ParallelDims& d, const MeshCoord& me, CommAxis a) {
  std::vector<int> out;
  const int n = d.size(a);
  for (int i = 0; i < n; ++i) {
    MeshCoord c = me;
    int rest = i;
    for (int g = kNumGridAxes - 1; g >= 0; --g)
      if (spans(a, static_cast<GridAxis>(g))) {
        const int deg = d.degree(static_cast<GridAxis>(g));
        c.at(static_cast<GridAxis>(g)) = rest % deg;
        rest /= deg;
      }
    out.push_back(mesh_rank(d, c));
  }
  return out;
}

bool group_crosses_nodes(const ParallelDims& d, const MeshCoord& me, CommAxis a, int ranks_per_node) {
  if (ranks_per_node <= 0 || a == CommAxis::dp_shard_node) return false;
  // Ranks grow with a group's coordinates: its first and last members bound its nodes.
  MeshCoord first = me, last = me;
  for (int g = 0; g < kNumGridAxes; ++g)
    if (spans(a, static_cast<GridAxis>(g))) {
      first.at(static_cast<GridAxis>(g)) = 0;
      last.at(static_cast<GridAxis>(g)) = d.degree(static_cast<GridAxis>(g)) - 1;
    }
  return mesh_rank(d, first) / ranks_per_node != mesh_rank(d, last) / ranks_per_node;
}

bool Mesh::crosses_nodes(CommAxis a) const {
  if (ranks_per_node_ <= 0) return false;
  if (a == CommAxis::dp_shard_cross) return has(a) && comms_[static_cast<size_t>(a)]->world_size() > 1;
  return group_crosses_nodes(dims_, me_, a, ranks_per_node_);
}

Mesh::LinkBytes Mesh::last_step_bytes_by_link() const {
  LinkBytes b;
  for (int a = 0; a < kNumCommAxes; ++a)
    (crosses_nodes(static_cast<CommAxis>(a)) ? b.inter : b.intra) += last_step_bytes()[a];
  return b;
}

void Mesh::pace_inter_node(double bytes_per_s) {
  for (int a = 0; a < kNumCommAxes; ++a)
    if (comms_[static_cast<size_t>(a)] && crosses_nodes(static_cast<CommAxis>(a)))
      comms_[static_cast<size_t>(a)]->pace(bytes_per_s);
}

namespace {
// The group's members (world ranks, in group order) on each of its nodes: consecutive, as ranks
// grow with the group's coordinates. InputError unless every node holds as many of them.
int members_per_node(const std::vector<int>& m, int R, const ParallelDims& d) {
  std::vector<int> firsts;  // the group rank of each node's first member
  for (size_t i = 0; i < m.size(); ++i)
    if (i == 0 || m[i] / R != m[i - 1] / R) firsts.push_back(static_cast<int>(i));
  const int N = static_cast<int>(firsts.size());
  for (int k = 0; k < N; ++k) {
    const int count = (k + 1 < N ? firsts[k + 1] : static_cast<int>(m.size())) - firsts[k];
    SHARD_REQUIRE(count * N == static_cast<int>(m.size()),
                  "--ranks-per-node {} puts {} of the {} ranks of the shard group of rank {} ({}) on node {}, so its "
                  "{} nodes cannot hold as many each: ZeRO++ needs an equal share on every node",
                  R, count, m.size(), m[0], d.describe(), m[firsts[k]] / R, N);
  }
  return static_cast<int>(m.size()) / N;
}
}  // namespace

void Mesh::split_nodes() {
  const int R = ranks_per_node_, W = world_.world_size();
  SHARD_REQUIRE(W % R == 0, "--ranks-per-node {} does not divide the world of {} ranks into nodes", R, W);
  // Every shard group checked on every rank (each group's first member is a rank with no shard
  // coordinate), so all of them refuse a layout together, before any split.
  for (int r = 0; r < W; ++r) {
    const MeshCoord c = mesh_coord(dims_, r);
    if (c.dp_shard == 0 && c.cp == 0) members_per_node(group_members(dims_, c, CommAxis::dp_shard_cp), R, dims_);
  }
  const std::vector<int> m = group_members(dims_, me_, CommAxis::dp_shard_cp);
  const int my_node = world_.rank() / R, L = members_per_node(m, R, dims_), N = static_cast<int>(m.size()) / L;
  const int me = rank(CommAxis::dp_shard_cp);
  const int n = me / L, l = me % L;
  SHARD_CHECK(m[me] == world_.rank() && m[n * L] / R == my_node, "node split: rank {} at group place {}",
              world_.rank(), me);
  auto node = world_.split(m[n * L], world_.rank(), L, l, CommAxis::dp_shard_node);
  auto cross = world_.split(W + m[l], world_.rank(), N, n, CommAxis::dp_shard_cross);
  comms_[static_cast<size_t>(CommAxis::dp_shard_node)] = node.get();
  comms_[static_cast<size_t>(CommAxis::dp_shard_cross)] = cross.get();
  owned_.push_back(std::move(node));
  owned_.push_back(std::move(cross));
}

Mesh::Mesh(Communicator& world, ParallelDims dims, int ranks_per_node, bool node_groups)
    : world_(world), dims_(dims), ranks_per_node_(ranks_per_node) {
  SHARD_CHECK(dims_.is_resolved() && dims_.world() == world.world_size(), "mesh {} over a world of {}",
              dims_.describe(), world.world_size());
  me_ = mesh_coord(dims_, world.rank());
  comms_[static_cast<size_t>(CommAxis::world)] = &world_;
  // Every axis gets a communicator of its own, so its traffic is counted under it; the data-parallel
  // group is the world's when it spans the world (the loss, DDP's buckets: the world's own traffic).
  // The same order on every rank: the splits are collective over the world. At cp 1 the groups
  // with cp are those without it (the same communicators: their traffic counts as before).
  // Likewise at ep 1: no ep group, and edp_cp is dp_cp.
  const bool cp = dims_.cp > 1, ep = dims_.ep > 1;
  for (CommAxis a : {CommAxis::dp_shard, CommAxis::dp_replicate, CommAxis::dp, CommAxis::tp, CommAxis::pp,
                     CommAxis::cp, CommAxis::dp_shard_cp, CommAxis::dp_cp, CommAxis::ep, CommAxis::edp_cp}) {
    if (!cp && (a == CommAxis::cp || a == CommAxis::dp_shard_cp || a == CommAxis::dp_cp)) {
      const CommAxis same = a == CommAxis::dp_cp ? CommAxis::dp : CommAxis::dp_shard;
      if (a != CommAxis::cp) comms_[static_cast<size_t>(a)] = &comm(same);
      continue;
    }
    if (!ep && (a == CommAxis::ep || a == CommAxis::edp_cp)) {
      if (a == CommAxis::edp_cp) comms_[static_cast<size_t>(a)] = &comm(CommAxis::dp_cp);
      continue;
    }
    const int n = dims_.size(a);
    if (world.world_size() == 1 ||
        ((a == CommAxis::dp || a == CommAxis::dp_cp || a == CommAxis::edp_cp) && n == world.world_size())) {
      comms_[static_cast<size_t>(a)] = &world_;
      continue;
    }
    owned_.push_back(world_.split(group_color(dims_, me_, a), world.rank(), n, rank(a), a));
    comms_[static_cast<size_t>(a)] = owned_.back().get();
  }
  if (dims_.pp > 1) {  // after the axes, in the same order everywhere; the middle stages split alone
    const bool end = me_.pp == 0 || me_.pp + 1 == dims_.pp;
    MeshCoord first;
    first.tp = me_.tp;
    const int dp = dims_.dp() * dims_.cp, color = end ? mesh_rank(dims_, first) : world.rank();
    auto c = world_.split(color, world.rank(), end ? 2 * dp : 1,
                          end ? (me_.pp == 0 ? 0 : dp) + rank(CommAxis::dp_cp) : 0, CommAxis::pp);
    if (end) tied_ = c.get();
    owned_.push_back(std::move(c));
  }
  SHARD_REQUIRE(ranks_per_node >= 0, "--ranks-per-node {}: expected a positive count (0: one node)", ranks_per_node);
  SHARD_REQUIRE(!node_groups || ranks_per_node > 0, "node groups without --ranks-per-node");
  if (node_groups) split_nodes();
}

}  // namespace shardlab
