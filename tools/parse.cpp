// parse.cpp — how every command reads its options (cli::parse: renamed flags, switches, stray
// words, --config FILE, where each option came from, closest-name suggestions) and which given flags
// a run does not use (cli::check_applicable). The option groups themselves are in options.cpp.
#include "tools/options.hpp"

#include <fmt/format.h>

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <set>

#include "src/core/suggest.hpp"
#include "src/core/units.hpp"
#include "tools/runtime.hpp"

namespace shardlab::cli {


// ---- parsing ----------------------------------------------------------------------------------

namespace {

// Flags renamed so that one name means one thing (docs/commands.md, "Renamed options"). `accepted`: the old
// spelling meant one thing, so it still works (with a note); otherwise it now means something else
// in another command and is refused, naming the new spelling.
struct Rename {
  const char* command;
  const char* from;
  const char* to;
  bool accepted;
};
constexpr Rename kRenames[] = {
    {"profile", "budget", "device-memory", true},   // one concept: a rank's device budget
    {"profile", "host-budget", "host-memory", true},
    {"plan", "measure", "measure-top", false},      // profile's --measure is a switch
    // plan/2's rates are the device's datasheet figures with stated achievable shares (plan/1's were
    // achieved figures): the same number means something else, so the old names are refused.
    {"plan", "device-tflops", "peak-tflops", false},
    {"plan", "link-intra", "nvlink-gbs", false},
    {"plan", "link-inter", "network-gbs", false},
    {"plan", "host-link", "host-link-gbs", true},  // achieved, as before
    {"bench-gemm", "tokens", "rows", false},        // sample's --tokens counts generated tokens
};

// "--name" or "--name=value" -> name; anything else -> "".
std::string long_name(const std::string& arg) {
  if (arg.size() < 3 || arg.compare(0, 2, "--") != 0) return "";
  return arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
}

void apply_renames(std::vector<std::string>& args, const char* command, int rank) {
  for (std::string& a : args) {
    if (a == "--") break;
    const std::string name = long_name(a);
    for (const Rename& r : kRenames) {
      if (name != r.from || std::string(command) != r.command) continue;
      SHARD_REQUIRE(r.accepted, "{} --{} is now --{} (docs/commands.md, \"Renamed options\")", command, r.from, r.to);
      if (rank == 0) std::fprintf(stderr, "shardlab %s: --%s is now --%s\n", command, r.from, r.to);
      a = "--" + std::string(r.to) + a.substr(2 + name.size());
    }
  }
}

bool is_bool_word(std::string w) {
  for (char& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* b : {"true", "false", "1", "0", "yes", "no", "on", "off"})
    if (w == b) return true;
  return false;
}

// A switch's value may follow it as its own word (`--shuffle false`). Boost versions differ on
// whether an option with an implicit value takes the next word, so join the two: every build reads
// `--shuffle false` as false.
void join_switch_values(std::vector<std::string>& args, const Desc& desc) {
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--") break;
    if (args[i].find('=') != std::string::npos || long_name(args[i]).empty() || !is_bool_word(args[i + 1])) continue;
    const po::option_description* o = nullptr;
    try {
      o = desc.find_nothrow(long_name(args[i]), true);
    } catch (const po::error&) {  // ambiguous: the parser names it
    }
    if (o && dynamic_cast<const po::typed_value<bool>*>(o->semantic().get())) {
      args[i] += "=" + args[i + 1];
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    }
  }
}

// --threads past the cores this process may run on: OpenMP's threads then take turns on them, and a
// step can be many times slower (64 threads on 2 cores: 8.7 s a step against 70 ms).
// The most threads a rank may ask for: OpenMP's runtime fails past a few tens of thousands (a crash,
// not a message), and far fewer already only take turns on the cores.
constexpr int kMaxThreads = 1024;

void check_threads(const po::variables_map& vm, int rank) {
  if (!vm.count("threads") || vm["threads"].defaulted()) return;
  const int threads = vm["threads"].as<int>();
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
  SHARD_REQUIRE(threads <= kMaxThreads, "--threads {}: at most {} (this process may use {} core{}; 0 picks for you)",
                threads, kMaxThreads, cores, cores == 1 ? "" : "s");
  if (rank == 0 && cores > 0 && threads > cores)
    std::fprintf(stderr, "shardlab: warning: --threads %d is more than the %d core%s this process may use: the threads "
                 "will take turns on them and every step slows down\n", threads, cores, cores == 1 ? "" : "s");
}

}  // namespace

Desc command_options(const char* command) {
  Desc d(std::string(command) + " options");
  d.add_options()("help,h", "show this command's options");
  return d;
}

namespace {

// Options that name a file or a directory.
bool names_a_path(const std::string& name) {
  static const std::set<std::string> paths = {"save-dir", "save", "log", "data", "val-data", "init", "resume",
                                              "tokenizer", "json", "html", "trace", "out", "config", "checkpoint"};
  return paths.count(name) != 0;
}

// What each option given in `parsed` was set to, and where; options already listed keep their
// first source (the command line is read before the config file and wins).
void note_sources(const po::parsed_options& parsed, const std::string& origin, OptionSources& out) {
  for (const po::option& o : parsed.options) {
    if (o.string_key.empty() || o.string_key == "help" || o.string_key == "config") continue;
    bool seen = false;
    for (const OptionSource& s : out) seen |= s.name == o.string_key;
    if (seen) continue;
    SHARD_REQUIRE(!(o.value.size() == 1 && o.value[0].empty() && names_a_path(o.string_key)),
                  "--{} '' ({}): expected a path; an empty one would silently write or read nothing (leave the option "
                  "out for its default)", o.string_key, origin);
    std::string value;
    for (const std::string& v : o.value) value += (value.empty() ? "" : " ") + v;
    out.push_back({o.string_key, o.value.empty() ? "true" : value.empty() ? "''" : value, origin});
  }
}

// --config FILE's options, stored after the command line's so that those win (po::store keeps a
// value already stored). Every name must be an option of this command.
void store_config_file(const std::string& path, const Desc& desc, const char* command, po::variables_map& vm,
                       OptionSources& sources) {
  std::ifstream in(path);
  SHARD_REQUIRE(in.good(), "--config '{}': cannot read the file", path);
  po::parsed_options parsed(&desc);
  try {
    parsed = po::parse_config_file(in, desc, false);
  } catch (const po::error& e) {
    throw InputError(fmt::format("--config '{}': {} (a line is `name = value`, names as {}'s options without the "
                                 "dashes; see `shardlab {} --help`)", path, e.what(), command, command));
  }
  note_sources(parsed, "config " + path, sources);
  po::store(parsed, vm);
}

}  // namespace

std::string describe(const OptionSources& sources) {
  std::string line;
  for (const OptionSource& s : sources)
    line += fmt::format("{}--{} {} ({})", line.empty() ? "" : ", ", s.name, s.value, s.origin);
  return line;
}

bool parse(std::vector<std::string> args, const Desc& desc, int rank, const Usage& usage, OptionSources* sources,
           po::variables_map* given) {
  std::string config_path;
  Desc all;  // the command's options and --config, which every command takes
  all.add(desc);
  Desc file_group("options from a file");
  file_group.add_options()("config", po::value(&config_path)->value_name("FILE"),
                           "read options from FILE, one `name = value` per line (names without the dashes, `#` "
                           "comments); options on the command line override it");
  all.add(file_group);
  apply_renames(args, usage.command, rank);
  join_switch_values(args, all);
  po::variables_map vm;
  OptionSources found;
  try {
    po::parsed_options parsed = po::command_line_parser(args).options(all).run();
    bool operand_taken = false;
    for (po::option& o : parsed.options) {
      if (!o.string_key.empty()) continue;  // a bare word: an operand, or a mistake
      const std::string word = o.original_tokens.empty() ? "" : o.original_tokens[0];
      SHARD_REQUIRE(usage.positional && (usage.positional_many || !operand_taken),
                    "unexpected argument '{}': every option is --name VALUE and switches take true or false "
                    "(see `shardlab {} --help`)", word, usage.command);
      o.string_key = usage.positional;
      operand_taken = true;
    }
    note_sources(parsed, "command line", found);
    po::store(parsed, vm);
    if (vm.count("config")) store_config_file(vm["config"].as<std::string>(), desc, usage.command, vm, found);
    po::notify(vm);
  } catch (const po::unknown_option& e) {
    std::string name = e.get_option_name();
    name.erase(0, name.find_first_not_of('-'));
    std::vector<std::string> names;
    for (const auto& o : desc.options()) names.push_back(o->long_name());
    throw InputError(fmt::format("{}{} (see `shardlab {} --help`)", e.what(), did_you_mean(name, names, "--"),
                                 usage.command));
  } catch (const po::error& e) {
    throw InputError(fmt::format("{} (see `shardlab {} --help`)", e.what(), usage.command));
  }
  check_threads(vm, rank);
  if (given) *given = vm;
  if (sources) *sources = std::move(found);
  if (!vm.count("help")) return true;
  if (rank == 0)
    std::cout << "usage: shardlab " << usage.command << " " << usage.operands << (*usage.operands ? " " : "")
              << "[options]\n\n" << all << "\n";
  return false;
}


// ---- flags a run does not use --------------------------------------------------------------------

namespace {

// A strategy's own flags and the strategies that read them.
struct StrategyFlag {
  const char* flag;
  std::vector<StrategyKind> used_by;
  const char* applies_to;
};
const std::vector<StrategyFlag>& strategy_flags() {
  static const std::vector<StrategyFlag> flags = {
      {"bucket-mb", {StrategyKind::ddp}, "ddp (gradient buckets)"},
      {"reshard-after-forward", {StrategyKind::zero3}, "zero3 and hsdp (gathered parameters)"},
      {"prefetch", {StrategyKind::zero3}, "zero3 and hsdp (gathered parameters)"},
      {"max-gathered", {StrategyKind::zero3}, "zero3 and hsdp (gathered parameters)"},
      {"zeropp", {StrategyKind::zero3}, "zero3 and hsdp (ZeRO++)"},
      {"quantize-weights", {StrategyKind::zero3}, "zero3 and hsdp (ZeRO++)"},
      {"secondary-shard", {StrategyKind::zero3}, "zero3 and hsdp (ZeRO++)"},
      {"quantize-grads", {StrategyKind::zero3}, "zero3 and hsdp (ZeRO++)"},
      {"quantize-block", {StrategyKind::zero3}, "zero3 and hsdp (ZeRO++)"},
      {"error-feedback", {StrategyKind::zero3}, "zero3 and hsdp (ZeRO++)"},
  };
  return flags;
}

// Flags that mean something only beside another setting (an axis, a feature): given with a value
// that asks for something (`used`) without it (`present`), they would be ignored, so the run is
// refused naming what each needs. A value that asks for nothing (--save-every 0, --cp-method
// allgather, the default spelled out by a wrapper or a --config file) passes. One table for every
// such flag.
struct DependentFlag {
  const char* flag;
  const char* needs;
  bool (*present)(const TrainConfig&);
  bool (*used)(const TrainConfig&);
};
const std::vector<DependentFlag>& dependent_flags() {
  static const auto cp = [](const TrainConfig& c) { return c.layout.dims.cp > 1; };
  static const auto pp = [](const TrainConfig& c) { return c.layout.dims.pp > 1; };
  static const auto save_dir = [](const TrainConfig& c) { return !c.save_dir.empty(); };
  static const auto sampling = [](const TrainConfig& c) { return c.sample_every > 0; };
  static const TrainConfig d;  // the defaults
  static const std::vector<DependentFlag> flags = {
      {"cp-method", "--cp 2 or more (context parallelism)", cp,
       [](const TrainConfig& c) { return c.layout.cp.method != d.layout.cp.method; }},
      {"cp-balance", "--cp 2 or more (context parallelism)", cp,
       [](const TrainConfig& c) { return c.layout.cp.balance != d.layout.cp.balance; }},
      {"pp-schedule", "--pp 2 or more (pipeline parallelism)", pp,
       [](const TrainConfig& c) { return c.layout.pipeline.schedule != d.layout.pipeline.schedule; }},
      {"pp-virtual", "--pp 2 or more (pipeline parallelism)", pp,
       [](const TrainConfig& c) { return c.layout.pipeline.virtual_stages > 1; }},
      {"pp-split", "--pp 2 or more (pipeline parallelism)", pp,
       [](const TrainConfig& c) { return !c.layout.pipeline.split.empty(); }},
      {"save-every", "--save-dir (checkpoints)", save_dir, [](const TrainConfig& c) { return c.save_every != 0; }},
      // A failed --save's rescue checkpoint is watched by it too.
      {"save-timeout", "--save-dir or --save (checkpoints and the final weights)",
       [](const TrainConfig& c) { return !c.save_dir.empty() || !c.save_path.empty(); },
       [](const TrainConfig&) { return true; }},
      {"save-keep", "--save-dir (checkpoints)", save_dir, [](const TrainConfig& c) { return c.save_keep != 0; }},
      {"save-overwrite", "--save (the final weights)", [](const TrainConfig& c) { return !c.save_path.empty(); },
       [](const TrainConfig& c) { return c.save_overwrite; }},
      {"save-async", "--save-dir (checkpoints)", save_dir, [](const TrainConfig& c) { return c.save_async; }},
      {"save-best", "--save-dir (checkpoints)", save_dir, [](const TrainConfig& c) { return c.save_best; }},
      {"max-skipped-steps", "--skip-nonfinite", [](const TrainConfig& c) { return c.skip_nonfinite; },
       [](const TrainConfig& c) { return c.max_skipped_steps != d.max_skipped_steps; }},
      {"sample-prompt", "--sample-every K (samples during training)", sampling,
       [](const TrainConfig& c) { return !c.sample_prompt.empty(); }},
      {"sample-tokens", "--sample-every K (samples during training)", sampling,
       [](const TrainConfig& c) { return c.sample.tokens != d.sample.tokens; }},
      {"sample-temperature", "--sample-every K (samples during training)", sampling,
       [](const TrainConfig& c) { return c.sample.temperature != d.sample.temperature; }},
  };
  return flags;
}

std::string names(const std::vector<StrategyKind>& kinds) {
  std::string s;
  for (StrategyKind k : kinds) {
    if (!s.empty()) s += ',';
    s += strategy_name(k);
  }
  return s;
}

}  // namespace

void check_applicable(const po::variables_map& vm, TrainConfig& cfg, const std::vector<StrategyKind>& kinds,
                      bool several, const char* command, int rank) {
  SHARD_REQUIRE(!several || !given_flag(vm, "strategy"),
                "{} --strategy {}: {} runs each of --strategies ({}); --strategy applies to train", command,
                vm["strategy"].as<std::string>(), command, names(kinds));
  for (const StrategyFlag& f : strategy_flags()) {
    if (!given_flag(vm, f.flag)) continue;
    std::vector<StrategyKind> using_it;
    for (StrategyKind k : kinds)
      if (std::find(f.used_by.begin(), f.used_by.end(), k) != f.used_by.end()) using_it.push_back(k);
    SHARD_REQUIRE(!using_it.empty(), "--{} applies to {}, not to {} {}: leave it out", f.flag, f.applies_to,
                  several ? "--strategies" : "--strategy", names(kinds));
    if (using_it.size() < kinds.size() && rank == 0)
      std::fprintf(stderr, "shardlab %s: note: --%s applies to %s only; of --strategies %s, %s use%s it\n", command,
                   f.flag, f.applies_to, names(kinds).c_str(), names(using_it).c_str(), using_it.size() == 1 ? "s" : "");
  }
  for (const DependentFlag& f : dependent_flags())
    SHARD_REQUIRE(!given_flag(vm, f.flag) || f.present(cfg) || !f.used(cfg), "--{} applies with {} only, which this {} "
                  "does not have: leave it out, or add that", f.flag, f.needs, command);
  const OptimizerKind opt = cfg.optim.kind;
  for (const char* f : {"beta1", "beta2", "eps"})
    SHARD_REQUIRE(opt != OptimizerKind::sgd || !given_flag(vm, f),
                  "--{} applies to --optimizer adamw (and muon's other tensors), not sgd: leave it out", f);
  SHARD_REQUIRE(opt != OptimizerKind::adamw || !given_flag(vm, "momentum"),
                "--momentum applies to --optimizer sgd or muon, not adamw: leave it out");
  for (const char* f : {"muon-ns-steps", "muon-ns-dtype", "muon-adjust-lr"})
    SHARD_REQUIRE(opt == OptimizerKind::muon || !given_flag(vm, f), "--{} applies to --optimizer muon, not {}: leave "
                  "it out", f, optimizer_name(opt));
  if (opt == OptimizerKind::muon && !given_flag(vm, "momentum")) cfg.optim.momentum = kMuonMomentum;
  for (const char* flag : {"min-lr-frac", "lr-decay-steps"})
    SHARD_REQUIRE(cfg.schedule.kind != ScheduleKind::constant || !given_flag(vm, flag),
                  "--{} applies to --schedule cosine, not constant: leave it out", flag);
  if (rank == 0 && cfg.schedule.warmup_steps > cfg.steps)
    std::fprintf(stderr, "shardlab %s: warning: --warmup-steps %lld%s is longer than the run (--steps %lld): the "
                 "learning rate never reaches --lr\n", command, static_cast<long long>(cfg.schedule.warmup_steps),
                 given_flag(vm, "warmup-steps") ? "" : " (the default)", static_cast<long long>(cfg.steps));
}


bool given_flag(const po::variables_map& vm, const char* flag) { return vm.count(flag) && !vm[flag].defaulted(); }

}  // namespace shardlab::cli
