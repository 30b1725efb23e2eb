// Copyright (c) 2026 the cistern developers. SPDX-License-Identifier: Apache-2.0
#include "support/reference_figures.hpp"

#include <cctype>

namespace cistern::testing {

const std::vector<ReferenceFigures>& reference_figures() {
  // Copied from ../shared/traces/README.md, "Reference figures".
  static const std::vector<ReferenceFigures> all = {
      {"pytorch/DeComFL/memory.pickle.gz", 0, 7946, 0, 1783664516, 1897922560, "pytorch"},
      {"pytorch/cs336_MAGMA27/memory_snapshot.pickle.gz", 0, 1721, 1373919236, 13923997700,
       14180941824, "pytorch"},
      {"pytorch/cs336_Wedsonlin/medium_ctx1024_inference.pickle.gz", 0, 1280, 1701711872,
       2877435904, 3204448256, "pytorch"},
      {"pytorch/cs336_Wedsonlin/medium_ctx1024_training.pickle.gz", 0, 7591, 5095895040,
       24207167496, 25178406912, "pytorch"},
      {"pytorch/cs336_Wedsonlin/medium_ctx128_inference.pickle.gz", 0, 1280, 1701310464, 1736962048,
       1763704832, "pytorch"},
      {"pytorch/cs336_Wedsonlin/medium_ctx128_training.pickle.gz", 0, 6526, 5095321600, 7013335044,
       7235174400, "pytorch"},
      {"pytorch/cs336_Wedsonlin/medium_ctx256_inference.pickle.gz", 0, 1280, 1701367808, 1793775616,
       1864368128, "pytorch"},
      {"pytorch/cs336_Wedsonlin/medium_ctx256_training.pickle.gz", 0, 6624, 5095403520, 9103544320,
       9265217536, "pytorch"},
      {"pytorch/cs336_Wedsonlin/medium_ctx512_inference.pickle.gz", 0, 1666, 1701482496, 1949343744,
       1981808640, "pytorch"},
      {"pytorch/cs336_Wedsonlin/medium_ctx512_training.pickle.gz", 0, 7591, 5095567360, 12426629128,
       12660506624, "pytorch"},
      {"kineto/df_index_resolver.json.gz", 1, 13385, 4096614400, 6629508096, 12782141440, "kineto"},
      {"somas/bert_base.csv", 0, 5620, 0, 15734934689, std::nullopt, "lifetimes"},
      {"somas/resnet50.csv", 0, 1042, 0, 1515472556, std::nullopt, "lifetimes"},
      {"somas/tiny_bert.csv", 0, 1821, 0, 758936113, std::nullopt, "lifetimes"},
      {"minimalloc/A.1048576.csv", 0, 154, 0, 1048576, std::nullopt, "lifetimes"},
      {"minimalloc/B.1048576.csv", 0, 170, 0, 1048576, std::nullopt, "lifetimes"},
      {"minimalloc/C.1048576.csv", 0, 203, 0, 1039360, std::nullopt, "lifetimes"},
      {"minimalloc/D.1048576.csv", 0, 213, 0, 986112, std::nullopt, "lifetimes"},
      {"minimalloc/E.1048576.csv", 0, 215, 0, 1048576, std::nullopt, "lifetimes"},
      {"minimalloc/F.1048576.csv", 0, 296, 0, 1048576, std::nullopt, "lifetimes"},
      {"minimalloc/G.1048576.csv", 0, 308, 0, 1048576, std::nullopt, "lifetimes"},
      {"minimalloc/H.1048576.csv", 0, 316, 0, 1048576, std::nullopt, "lifetimes"},
      {"minimalloc/I.1048576.csv", 0, 374, 0, 1048576, std::nullopt, "lifetimes"},
      {"minimalloc/J.1048576.csv", 0, 409, 0, 989184, std::nullopt, "lifetimes"},
      {"minimalloc/K.1048576.csv", 0, 454, 0, 1048576, std::nullopt, "lifetimes"},
      {"minimalloc/example.input.12.csv", 0, 5, 0, 12, std::nullopt, "lifetimes"},
  };
  return all;
}

std::string identifier(const std::string& text) {
  std::string name = text;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

}  // namespace cistern::testing
