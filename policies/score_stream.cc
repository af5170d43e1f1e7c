#include "policies/score_stream.h"

namespace polykv::policies {

std::optional<ScoreStream> ParseScoreStream(std::string_view name) {
  for (ScoreStream s : AllScoreStreams()) {
    if (ScoreStreamName(s) == name) return s;
  }
  return std::nullopt;
}

}  // namespace polykv::policies
