#include "shard/strategy_formulas.hpp"

namespace shardlab {

double zero_model_states(StrategyKind k, double psi, int world, double optimizer_bytes) {
  const double n = world, K = optimizer_bytes;
  switch (zero_stage(k)) {
    case 1: return 4 * psi + K * psi / n;
    case 2: return 2 * psi + (2 + K) * psi / n;
    case 3: return (4 + K) * psi / n;
    default: return (4 + K) * psi;  // ddp, and dp's rank 0
  }
}

StepTraffic step_traffic(StrategyKind k, const TrafficInputs& in) {
  StepTraffic t;
  t.kind = k;
  t.N = in.world;
  t.S = in.dp_shard > 0 ? in.dp_shard : in.world;
  t.G = in.world / t.S;
  t.p = in.params * static_cast<double>(dtype_size(in.param_dtype));
  t.g = in.params * static_cast<double>(dtype_size(in.reduce_dtype));
  switch (k) {
    case StrategyKind::ddp: t.world = 2 * t.g; break;
    case StrategyKind::zero1:
    case StrategyKind::zero2:
      t.group_overlapped = t.g;
      t.group_exposed = t.p;
      t.across = 2 * t.g;
      t.per_micro = k == StrategyKind::zero2;
      break;
    case StrategyKind::zero3:
      t.group_overlapped = t.g + 2 * t.p;
      t.across = 2 * t.g;
      t.per_micro = true;
      break;
    case StrategyKind::dp:
      t.world = 2 * (4.0 * static_cast<double>(in.batch) * static_cast<double>(in.seq * in.vocab));
      t.rooted = t.p + t.g;
      break;
  }
  return t;
}

double StepTraffic::host_link(Offload off, double accum) const {
  if (off == Offload::none) return 0;
  const double gs = g / S, ps = p / S;
  return (kind == StrategyKind::zero1 ? 1 : accum) * gs + ps + (off == Offload::params ? 2 * accum * ps : 0);
}

double muon_exchange_bytes(StrategyKind k, const std::vector<UnitLayout>& units, int S) {
  if (zero_stage(k) == 0 || S <= 1) return 0;
  double bytes = 0;
  for (const UnitLayout& u : units)
    if (!muon_matrices(u, MuonAdjustLr::original).empty())
      bytes += 2.0 * (S - 1.0) / S * 4.0 * double(make_flat_param(u, S, 0).padded);
  return bytes;
}

double muon_tp_bytes(StrategyKind k, const std::vector<UnitLayout>& units, int S, int rank, int T) {
  if (T <= 1) return 0;
  std::vector<std::vector<MuonMatrix>> matrices;
  for (const UnitLayout& u : units) matrices.push_back(muon_matrices(u, MuonAdjustLr::original));
  const bool owners = zero_stage(k) > 0 && S > 1;
  if (owners) {
    std::vector<std::vector<MuonMatrix>*> groups;
    for (auto& m : matrices) groups.push_back(&m);
    assign_owners(groups, S, 5);  // the order of the iteration's costs: any step count gives it
  }
  double bytes = 0;
  for (const auto& unit : matrices)
    for (const MuonMatrix& m : unit)
      if (m.tp_dim >= 0 && (!owners || m.owner == rank)) bytes += (T - 1.0) / T * 4.0 * double(m.numel()) * T;
  return bytes;
}

}  // namespace shardlab
