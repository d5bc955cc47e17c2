// `shardlab tokenize --input FILES --out DIR --tokenizer DIR|bytes`: text files to llm.c token shards
// (a validation shard, then train shards), with progress (src/data/tokenize_shards.hpp). Rank 0.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "src/core/units.hpp"
#include "src/data/data.hpp"
#include "src/data/tokenize_shards.hpp"
#include "src/data/tokenizer.hpp"
#include "tools/command.hpp"
#include "tools/options.hpp"

namespace shardlab {
namespace {

// "100M", "5000", "1.5G": a count of tokens, K M G the powers of 1000.
int64_t parse_count(const std::string& text, const char* flag) {
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  const std::string unit = text.substr(std::min(used, text.size()));
  const double scale = unit.empty() ? 1 : unit == "K" ? 1e3 : unit == "M" ? 1e6 : unit == "G" ? 1e9 : -1;
  SHARD_REQUIRE(used > 0 && v >= 0 && scale > 0 && v * scale < 9e18, "{} '{}': expected a count of tokens (a number, "
                "K, M or G after it for thousands, millions, billions)", flag, text);
  return static_cast<int64_t>(v * scale + 0.5);
}

}  // namespace

ExitCode cmd_tokenize(const Args& args, const Context& ctx) {
  TokenizeConfig c;
  std::string inputs, tokenizer, eot = "auto", shard_tokens = "100M", val_tokens = "0";
  cli::Desc desc = cli::command_options("tokenize");
  desc.add_options()("input", cli::po::value(&inputs)->default_value(""),
                     "text files, each a document: a path, a comma-separated list or glob patterns (each pattern's "
                     "matches sorted by name), as --data takes them; also the operand")(
      "out", cli::po::value(&c.out_dir)->default_value(""), "the directory to write the shards to (created if needed)")(
      "tokenizer", cli::po::value(&tokenizer)->default_value(""),
      "a directory with a Hugging Face tokenizer.json, GPT-2's encoder.json and vocab.bpe, or tiktoken ranks (as "
      "train's --tokenizer), or 'bytes': each byte a token (train's text --data without --tokenizer)")(
      "prefix", cli::po::value(&c.prefix)->default_value(c.prefix),
      "shard names: PREFIX_val_000000.bin, PREFIX_train_000001.bin, ...")(
      "shard-tokens", cli::po::value(&shard_tokens)->default_value(shard_tokens),
      "tokens per train shard (llm.c's 10^8; K, M, G suffixes are powers of 1000); the last is shorter")(
      "val-tokens", cli::po::value(&val_tokens)->default_value(val_tokens),
      "the stream's first tokens, written as the validation shard PREFIX_val_000000.bin for train's --val-data "
      "(0: none)")(
      "eot", cli::po::value(&eot)->default_value(eot),
      "the token written before each document: auto (llm.c's: GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|>, "
      "else <|end_of_text|>; none if the tokenizer has none of them), none, or a token's text");
  cli::add_switch(desc, "overwrite", c.overwrite, "remove the shards of --prefix already in --out instead of refusing");
  if (!cli::parse(args, desc, ctx.mpi.rank(), {"tokenize", "FILES --out DIR --tokenizer DIR|bytes", "input"}))
    return ExitCode::ok;
  SHARD_REQUIRE(!inputs.empty() && !c.out_dir.empty() && !tokenizer.empty(),
                "usage: shardlab tokenize FILES --out DIR --tokenizer DIR|bytes");
  c.shard_tokens = parse_count(shard_tokens, "--shard-tokens");
  c.val_tokens = parse_count(val_tokens, "--val-tokens");
  if (ctx.mpi.rank() != 0) return ExitCode::ok;
  c.inputs = data_paths(inputs);
  std::unique_ptr<Tokenizer> tok;
  if (tokenizer != "bytes") tok = std::make_unique<Tokenizer>(tokenizer);
  c.vocab = tok ? static_cast<int64_t>(tok->size()) : 256;
  if (eot == "auto") {
    // llm.c's choice: GPT-2's <|endoftext|>, Llama 3's <|begin_of_text|> (fineweb.py), else an end token.
    c.eot = tok ? tok->find_token({"<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>"}) : -1;
  } else if (eot != "none") {
    SHARD_REQUIRE(tok, "--eot {} with --tokenizer bytes: bytes have no end-of-text token; give auto or none", eot);
    c.eot = tok->find_token({eot});
    SHARD_REQUIRE(c.eot >= 0, "--eot {}: not a token of {}", eot, tok->source());
  }
  c.whole_files = tok && tok->added_token_holds('\n');
  // Test hook: SHARDLAB_TOKENIZE_BLOCK_BYTES=N reads N bytes at a time, so a small file crosses cuts.
  if (const char* block = std::getenv("SHARDLAB_TOKENIZE_BLOCK_BYTES"); block && std::atoll(block) > 0)
    c.block_bytes = std::atoll(block);
  EncodeFn encode = [&tok](std::string_view text) {
    if (tok) return tok->encode(text);
    return std::vector<int32_t>(reinterpret_cast<const unsigned char*>(text.data()),
                                reinterpret_cast<const unsigned char*>(text.data()) + text.size());
  };
  std::printf("tokenize: %zu file(s) with %s (vocabulary %lld, %s before each document) into %s/%s_*.bin%s\n",
              c.inputs.size(), tok ? tok->source().c_str() : "bytes as tokens", static_cast<long long>(c.vocab),
              c.eot >= 0 ? fmt::format("id {}", c.eot).c_str() : "nothing", c.out_dir.c_str(), c.prefix.c_str(),
              c.whole_files ? " (each file encoded whole: an added token holds a newline)" : "");
  std::fflush(stdout);
  const TokenizeResult r = tokenize_to_shards(c, encode, stderr);
  std::printf("wrote %zu shard(s): %lld tokens (%lld in the validation shard) from %d document(s), %s, in %.1f s\n",
              r.shards.size(), static_cast<long long>(r.tokens), static_cast<long long>(r.val_tokens), r.documents,
              format_bytes(double(r.bytes_read)).c_str(), r.seconds);
  for (const std::string& s : r.shards) std::printf("  %s\n", s.c_str());
  return ExitCode::ok;
}

}  // namespace shardlab
