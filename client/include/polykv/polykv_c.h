/* C ABI of libpolykv_client, for workers written in other languages.
 *
 * Every function returns 0 on success or a gRPC status code (3 invalid
 * argument, 5 not found, 7 permission denied, 8 resource exhausted, 14
 * unavailable, ...); pkv_last_error() then gives the message for this thread.
 * Objects are owned by the caller and freed with the matching _free/_close. */
#ifndef POLYKV_POLYKV_C_H_
#define POLYKV_POLYKV_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Values of pkv_page.format and pkv_session_options.key_format/value_format
 * (the proto PageFormat wire values). */
enum {
  PKV_FORMAT_DEFAULT = 0, /* options only: the daemon's choice */
  PKV_FORMAT_F32 = 1,
  PKV_FORMAT_F16 = 2,
  PKV_FORMAT_BF16 = 3,
  PKV_FORMAT_FP8_E4M3 = 4,
  PKV_FORMAT_INT8 = 5,
  PKV_FORMAT_INT4 = 6,
  PKV_FORMAT_INT2 = 7
};

/* Values of pkv_session_options.dtype (the proto DType wire values). */
enum {
  PKV_DTYPE_DEFAULT = 0, /* f16 */
  PKV_DTYPE_F32 = 1,
  PKV_DTYPE_F16 = 2,
  PKV_DTYPE_BF16 = 3
};

typedef struct pkv_client pkv_client;
typedef struct pkv_session pkv_session;

typedef struct {
  uint64_t page_id;
  uint32_t arena_id;
  uint32_t layer;
  uint32_t is_value; /* 0 keys, 1 values */
  uint32_t format;   /* PKV_FORMAT_* */
  uint32_t size_bytes;
  uint32_t block_index;
  void* addr; /* mapped host address (C API sessions take host pages only) */
} pkv_page;

typedef struct {
  const char* agent_id;
  const char* tenant;
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t dtype;        /* PKV_DTYPE_* */
  uint32_t key_format;   /* PKV_FORMAT_* */
  uint32_t value_format; /* PKV_FORMAT_* */
  uint32_t block_tokens; /* 0 = daemon default */
} pkv_session_options;

int pkv_connect(const char* socket_path, pkv_client** out);
void pkv_client_free(pkv_client* client);

int pkv_session_open(pkv_client* client, const pkv_session_options* options, pkv_session** out);
/* Closes the session on the daemon and frees it. Safe on NULL. */
int pkv_session_close(pkv_session* session);

uint64_t pkv_session_id(const pkv_session* session);
uint32_t pkv_block_tokens(const pkv_session* session);
/* Score streams a worker measures for the daemon's policy (values equal
 * policies::ScoreStream, policies/score_stream.h, which says each one's
 * shape and how the daemon folds a report in). */
enum {
  PKV_STREAM_ATTENTION = 0,   /* per slot: mass since the last report, summed */
  PKV_STREAM_INTENT = 1,      /* per slot: relevance to the turn's intent */
  PKV_STREAM_IMPORTANCE = 2,  /* per slot: a reconstruction probe's most */
  PKV_STREAM_OBSERVATION = 3, /* per slot: the observation window's mass */
  PKV_STREAM_ENTROPY = 4,     /* per layer: mean decode attention entropy */
  PKV_NUM_STREAMS             /* how many there are */
};
/* 1 when the agent's policy reads `stream` (PKV_STREAM_*): measure and
 * report it (pkv_report), as of the last pkv_sync (the agent's QoS may
 * change mid-session); 0 otherwise or for an unknown stream. */
int pkv_wants(const pkv_session* session, uint32_t stream);
/* 1 when slot streams are wanted per layer (the policy keeps each layer's
 * slots apart), as of the last pkv_sync. */
int pkv_wants_per_layer(const pkv_session* session);
/* Per token a step writes, the factor the attention mass not yet reported
 * ages by (the policy's h2o.decay, as of the last pkv_sync): 1 = sum it
 * undecayed. 1 for a null session. */
float pkv_attention_decay(const pkv_session* session);
/* Reserves pages for num_tokens more tokens. */
int pkv_reserve(pkv_session* session, uint64_t num_tokens);
int pkv_commit(pkv_session* session, uint64_t committed_tokens);
int pkv_release(pkv_session* session, uint64_t keep_tokens);
size_t pkv_num_blocks(const pkv_session* session);
/* Copies the pages of block `block` (2 * num_layers of them, K then V per
 * layer) into pages[0..capacity). A layer that keeps a budget of its own
 * (layers=importance) holds none of one run of the session's blocks (its
 * hole, after the blocks of a shared prefix): its two entries there have
 * size_bytes 0 and addr NULL, and its slot positions there are -1
 * (pkv_layer_slot_info). */
int pkv_block_pages(const pkv_session* session, size_t block, pkv_page* pages, size_t capacity,
                    size_t* num_pages);

/* --- Daemon compaction (the policy engine) --- */

/* Adopts new block tables if the daemon's epoch moved (a compaction), then
 * acknowledges them. *changed (may be NULL) is 1 when the tables changed:
 * re-read the blocks, pkv_committed_tokens and pkv_slot_info. Call it at step
 * boundaries, when no kernel reads or writes the session's pages. */
int pkv_sync(pkv_session* session, int* changed);
uint64_t pkv_epoch(const pkv_session* session);
/* The worker goes idle (its agent waits): no kernel reads or writes the
 * session's pages until its next pkv_sync, which must be its next call (but
 * for pkv_session_close); polykvd may move the session to another daemon
 * meanwhile (polykvctl move) and that pkv_sync follows it, returning
 * changed. pkv_reserve, pkv_commit, pkv_release and the reports before it
 * fail with FAILED_PRECONDITION (9). */
int pkv_idle(pkv_session* session);
/* How many times pkv_sync followed the session to another polykvd. */
uint64_t pkv_moves(const pkv_session* session);
/* Slots of the tables that hold tokens (a compaction shrinks it). */
uint64_t pkv_committed_tokens(const pkv_session* session);
/* After a changed pkv_sync: for slots [first, first + n), the logical
 * position (the token's index in the conversation) and multiplicity (> 1
 * after a merge); either array may be NULL. OUT_OF_RANGE past the slots the
 * last changed sync described (none before one). */
int pkv_slot_info(const pkv_session* session, uint64_t first, size_t n, int64_t* positions,
                  uint32_t* counts);
/* pkv_slot_info's positions of one layer's slots: where a select=layer policy
 * compacted the layers apart, each layer holds its own tokens (layer 0's are
 * pkv_slot_info's); before that, every layer's are pkv_slot_info's.
 * OUT_OF_RANGE for a layer past the session's or slots past the last changed
 * sync. */
int pkv_layer_slot_info(const pkv_session* session, uint32_t layer, uint64_t first, size_t n,
                        int64_t* positions);

/* Values of pkv_slot_meta.role (policies/session_view.h Role). */
enum {
  PKV_ROLE_SYSTEM = 0,
  PKV_ROLE_USER = 1,
  PKV_ROLE_ASSISTANT = 2,
  PKV_ROLE_TOOL_CALL = 3,
  PKV_ROLE_TOOL_OUTPUT = 4,
  PKV_ROLE_ERROR = 5
};

/* What a policy knows of a slot besides its scores. */
typedef struct {
  int32_t turn;        /* 0-based message index */
  uint32_t role;       /* PKV_ROLE_* */
  uint32_t block_kind; /* policies/session_view.h BlockKind; 0 = none */
  uint32_t block_id;   /* slots of one structural block share it; 0 = none */
  uint32_t depth;      /* nesting depth */
  uint32_t boundary;   /* 1: first or last slot of its block */
  uint32_t pinned;     /* 1: never evicted */
} pkv_slot_meta;

/* Reports, for slots [first, first + n) of the current tables (committed),
 * their metadata; current_turn: the turn being decoded (0 = unchanged). One
 * call per step or chunk, not per token. FAILED_PRECONDITION when the epoch
 * moved (pkv_sync first); nothing is recorded then. */
int pkv_report_slots(pkv_session* session, uint64_t first, size_t n, const pkv_slot_meta* meta,
                     uint32_t current_turn);
/* Reports `count` values of `stream` (PKV_STREAM_*): a slot stream's for
 * slots [first, first + count) (per_layer 0), or [num_layers x n] layer-major
 * for slots [first, first + n) (per_layer 1, count = num_layers x n); a
 * per-layer stream's (entropy) [num_layers]. Values finite, >= 0 except
 * intent's. INVALID_ARGUMENT for a value or size the stream does not take,
 * FAILED_PRECONDITION when the epoch moved; nothing is recorded then. */
int pkv_report(pkv_session* session, uint32_t stream, uint64_t first, int per_layer,
               const float* values, size_t count);

/* Message of this thread's last failed call ("" if none). */
const char* pkv_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* POLYKV_POLYKV_C_H_ */
