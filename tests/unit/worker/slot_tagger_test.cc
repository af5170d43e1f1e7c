// SlotTagger: what the daemon's slot metadata holds after the worker's
// reports (each one overwriting [first_slot, first_slot + meta.size())) must
// be the tags the policies' own StructureTagger gives the same token stream.
#include "client/worker/slot_tagger.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "policies/tagger.h"

namespace polykv::worker {
namespace {

struct Piece {
  std::string text;
  int32_t turn;
  Role role;
};

// A tool output holding Python, then an error, then prose: kinds change
// within lines, so tags of a line's first tokens are provisional.
std::vector<Piece> Stream() {
  std::vector<Piece> p;
  auto add = [&](int32_t turn, Role role, std::vector<std::string> texts) {
    for (std::string& t : texts) p.push_back({std::move(t), turn, role});
  };
  add(0, Role::kUser, {"Please", " read", " the", " file", ".\n"});
  add(1, Role::kToolOutput, {"```", "python", "\n", "import", " os", "\n", "def", " load", "(",
                             "path", ")", ":", "\n", "    ", "return", " open", "(", "path",
                             ")", "\n", "```", "\n", "Traceback", " (", "most", " recent",
                             " call", " last", "):", "\n"});
  add(2, Role::kAssistant, {"The", " file", " defines", " load", ".", "\n"});
  add(3, Role::kUser, {"def", " g", "():", " pass"});
  return p;
}

std::vector<StepToken> Metas(const std::vector<Piece>& p) {
  std::vector<StepToken> m;
  for (size_t i = 0; i < p.size(); ++i) {
    m.push_back({static_cast<int32_t>(i), static_cast<int32_t>(i), p[i].turn, p[i].role});
  }
  return m;
}

std::vector<policies::StructTag> Reference(const std::vector<Piece>& p) {
  policies::StructureTagger t;
  for (size_t i = 0; i < p.size(); ++i) {
    if (i > 0 && p[i].turn != p[i - 1].turn) t.EndMessage();
    t.Feed(p[i].text, p[i].role);
  }
  return t.tags();
}

bool SameTag(const policies::StructTag& a, const policies::StructTag& b) {
  return a.kind == b.kind && a.block_id == b.block_id && a.depth == b.depth &&
         a.boundary == b.boundary;
}

void Apply(const SlotTagger::Report& r, std::vector<policies::SlotMeta>* daemon) {
  ASSERT_LE(r.first_slot + r.meta.size(), daemon->size()) << "reports only committed slots";
  for (size_t i = 0; i < r.meta.size(); ++i) (*daemon)[r.first_slot + i] = r.meta[i];
}

class SlotTaggerTest : public ::testing::TestWithParam<size_t> {};

// Commits of every size from 1 token to all of them at once.
TEST_P(SlotTaggerTest, TheDaemonEndsUpWithTheTaggersTags) {
  const std::vector<Piece> pieces = Stream();
  const std::vector<StepToken> metas = Metas(pieces);
  SlotTagger tagger([&](int32_t id) { return pieces[static_cast<size_t>(id)].text; });
  std::vector<policies::SlotMeta> daemon;
  const size_t step = GetParam();
  for (size_t first = 0; first < metas.size(); first += step) {
    const size_t n = std::min(step, metas.size() - first);
    daemon.resize(first + n);
    SlotTagger::Report r = tagger.Commit(first, std::span(metas).subspan(first, n));
    EXPECT_LE(r.first_slot, first);
    ASSERT_NO_FATAL_FAILURE(Apply(r, &daemon));
  }
  const std::vector<policies::StructTag> want = Reference(pieces);
  ASSERT_EQ(daemon.size(), want.size());
  int tagged = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(SameTag(daemon[i].tag, want[i])) << "token " << i << " '" << pieces[i].text
                                                 << "' kind " << int(daemon[i].tag.kind)
                                                 << " want " << int(want[i].kind);
    EXPECT_EQ(daemon[i].turn, pieces[i].turn);
    EXPECT_EQ(daemon[i].role, pieces[i].role);
    tagged += want[i].kind != policies::BlockKind::kNone;
  }
  EXPECT_GT(tagged, static_cast<int>(want.size()) / 2);  // the stream does exercise the tagger
}

INSTANTIATE_TEST_SUITE_P(CommitSizes, SlotTaggerTest, ::testing::Values(1, 2, 3, 7, 64));

TEST(SlotTaggerMovedTest, AfterTheSlotsMovedOnlyNewTokensAreReported) {
  const std::vector<Piece> pieces = Stream();
  const std::vector<StepToken> metas = Metas(pieces);
  SlotTagger tagger([&](int32_t id) { return pieces[static_cast<size_t>(id)].text; });
  // "def" of line 3 of the tool output: its line is unfinished, so provisional.
  SlotTagger::Report r = tagger.Commit(0, std::span(metas).first(7));
  EXPECT_EQ(r.first_slot, 0u);
  r = tagger.Commit(7, std::span(metas).subspan(7, 2));
  EXPECT_LT(r.first_slot, 7u) << "the unfinished line is re-reported";
  tagger.SlotsMoved();  // a compaction: slot 5 is some other token now
  r = tagger.Commit(3, std::span(metas).subspan(9, 2));
  EXPECT_EQ(r.first_slot, 3u);
  EXPECT_EQ(r.meta.size(), 2u);
}

TEST(SlotTaggerMovedTest, ACommitThatDoesNotFollowTheLastOneReportsOnlyItself) {
  const std::vector<Piece> pieces = Stream();
  const std::vector<StepToken> metas = Metas(pieces);
  SlotTagger tagger([&](int32_t id) { return pieces[static_cast<size_t>(id)].text; });
  (void)tagger.Commit(0, std::span(metas).first(8));
  // Slots 8.. were not where these tokens went (e.g. a lost report): no guess.
  SlotTagger::Report r = tagger.Commit(20, std::span(metas).subspan(8, 2));
  EXPECT_EQ(r.first_slot, 20u);
  EXPECT_EQ(r.meta.size(), 2u);
}

}  // namespace
}  // namespace polykv::worker
