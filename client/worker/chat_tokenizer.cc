#include "client/worker/chat_tokenizer.h"

#include <algorithm>

#include "absl/strings/match.h"

namespace polykv::worker {

absl::Status ChatTokenizer::SetTools(std::vector<JsonValue> tools) {
  if (previous_.has_value()) {
    return absl::FailedPreconditionError(
        "tools must be declared before the first message (they are part of the system turn)");
  }
  tools_ = std::move(tools);
  return absl::OkStatus();
}

std::string ChatTokenizer::AppendRendered(const std::string& text, int32_t turn, Role role,
                                          std::vector<TaggedToken>* out) {
  // A closing tool run belongs to the run's last message, not to this one.
  const std::string close = t_->CloseRun(previous_);
  if (!close.empty() && absl::StartsWith(text, close) && role != Role::kToolOutput) {
    Append(close, previous_turn_, Role::kToolOutput, out);
    Append(text.substr(close.size()), turn, role, out);
  } else {
    Append(text, turn, role, out);
  }
  previous_ = role;
  previous_turn_ = turn;
  return text;
}

std::string ChatTokenizer::AddMessage(const ChatMessage& m, int32_t turn,
                                      std::vector<TaggedToken>* out) {
  return AppendRendered(t_->RenderMessage(m, previous_, tools_), turn, m.role, out);
}

std::string ChatTokenizer::AddGenerationPrompt(int32_t turn, std::vector<TaggedToken>* out) {
  std::string text =
      AppendRendered(t_->GenerationPrompt(previous_, tools_), turn, Role::kAssistant, out);
  Flush(out);
  return text;
}

std::string ChatTokenizer::AddAfterGeneratedTurn(int32_t turn, std::vector<TaggedToken>* out) {
  // The generated ids ended at a special token (the end of turn), so what
  // follows starts a fresh text.
  Flush(out);
  const std::string text = t_->AfterEndOfTurn();
  Append(text, turn, Role::kAssistant, out);
  previous_ = Role::kAssistant;
  previous_turn_ = turn;
  return text;
}

std::string ChatTokenizer::Close(std::vector<TaggedToken>* out) {
  const std::string text = t_->CloseRun(previous_);
  if (!text.empty()) Append(text, previous_turn_, Role::kToolOutput, out);
  Flush(out);
  return text;
}

void ChatTokenizer::Flush(std::vector<TaggedToken>* out) { Emit(held_.size(), out); }

void ChatTokenizer::Append(const std::string& piece, int32_t turn, Role role,
                           std::vector<TaggedToken>* out) {
  if (piece.empty()) return;
  if (absl::StartsWith(piece, t_->start_of_turn()) || absl::StartsWith(piece, t_->end_of_turn())) {
    Flush(out);
  }
  held_ += piece;
  segments_.push_back(Segment{held_.size(), turn, role});
  size_t cut = 0;
  for (const std::string& special : {t_->start_of_turn(), t_->end_of_turn()}) {
    const size_t at = held_.rfind(special);
    if (at != std::string::npos) cut = std::max(cut, at + special.size());
  }
  if (cut > 0) Emit(cut, out);
}

void ChatTokenizer::Emit(size_t n, std::vector<TaggedToken>* out) {
  if (n == 0) return;
  const std::vector<int32_t> ids = tok_ == nullptr
                                       ? std::vector<int32_t>()
                                       : tok_->Encode(std::string_view(held_).substr(0, n), true);
  // A token is tagged with the segment its first byte is in. (Byte offsets
  // from decoding; a normalizer that changes the text shifts them, which
  // only moves a tag across a boundary.)
  size_t offset = 0, seg = 0;
  for (const int32_t id : ids) {
    while (seg + 1 < segments_.size() && segments_[seg].end <= offset) ++seg;
    out->push_back(TaggedToken{id, segments_[seg].turn, segments_[seg].role});
    offset += tok_->Decode(std::span(&id, 1)).size();
  }
  held_.erase(0, n);
  std::vector<Segment> rest;
  for (const Segment& s : segments_) {
    if (s.end > n) rest.push_back(Segment{s.end - n, s.turn, s.role});
  }
  segments_ = std::move(rest);
}

}  // namespace polykv::worker
