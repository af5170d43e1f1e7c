/* Compiled as C: the C ABI header must stay valid C, usable without C++. */
#include "polykv/polykv_c.h"

int polykv_c_abi_reserve_one_block(pkv_session* session) {
  return pkv_reserve(session, pkv_block_tokens(session));
}
