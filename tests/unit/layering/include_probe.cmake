# cmake -DCXX=<compiler> -DRSP_DIR=<dir with <target>.rsp> -P include_probe.cmake
# Each case: target, expectation (FAIL = must not be found, OK = must compile), the
# include line. Forbidden edges from docs/architecture.md: policies -> daemon,
# kernels -> policies/client/proto, client -> daemon, proto -> ours, and inside the
# daemon no room includes one above it (only rpc sees the generated proto).
set(cases
  "polykv_policies|FAIL|#include \"daemon/pool/kv_pool.h\""
  "polykv_policies|FAIL|#include <daemon/pool/kv_pool.h>"
  "polykv_policies|FAIL|#include \"client/worker/unicode_tables.inc\""
  "polykv_policies|FAIL|#include \"polykv/v1/session.pb.h\""
  "polykv_policies|OK|#include \"kernels/page_format.h\""
  "polykv_kernels|FAIL|#include \"policies/plan.h\""
  "polykv_kernels|FAIL|#include \"polykv/client.h\""
  "polykv_kernels|FAIL|#include \"client/lib/channel.h\""
  "polykv_kernels|FAIL|#include \"proto/polykv/v1/fd_socket.h\""
  "polykv_kernels|FAIL|#include \"daemon/memory/arena.h\""
  "polykv_kernels|OK|#include \"kernels/ops.h\""
  "polykv_proto|FAIL|#include \"kernels/ops.h\""
  "polykv_proto|OK|#include \"proto/polykv/v1/fd_socket.h\""
  "polykv_client|FAIL|#include \"daemon/pool/kv_pool.h\""
  "polykv_client|FAIL|#include \"daemon/daemon.h\""
  "polykv_client|OK|#include \"polykv/client.h\""
  "polykv_client|OK|#include \"polykv/v1/session.pb.h\""
  "polykv_worker_core|FAIL|#include \"daemon/pool/kv_pool.h\""
  "polykv_worker_core|FAIL|#include \"client/lib/channel.h\""
  "polykv_worker_core|OK|#include \"polykv/client.h\""
  "polykv_worker_core|OK|#include \"kernels/ops.h\""
  "polykv_daemon_memory|FAIL|#include \"daemon/pool/kv_pool.h\""
  "polykv_daemon_pool|FAIL|#include \"daemon/rpc/convert.h\""
  "polykv_daemon_pool|FAIL|#include \"daemon/metrics/metrics.h\""
  "polykv_daemon_pool|FAIL|#include \"polykv/v1/session.pb.h\""
  "polykv_daemon_pool|OK|#include \"daemon/memory/arena.h\""
  "polykv_daemon_rpc|FAIL|#include \"daemon/daemon.h\""
  "polykv_daemon_rpc|OK|#include \"daemon/pool/kv_pool.h\"")

set(failed 0)
set(n 0)
foreach(c IN LISTS cases)
  string(REPLACE "|" ";" f "${c}")
  list(GET f 0 target)
  list(GET f 1 expect)
  list(GET f 2 line)
  math(EXPR n "${n} + 1")
  set(rsp ${RSP_DIR}/${target}.rsp)
  if(NOT EXISTS ${rsp})
    message(SEND_ERROR "no ${rsp} (target ${target} not configured)")
    set(failed 1)
    continue()
  endif()
  set(src ${RSP_DIR}/probe_${n}.cc)
  file(WRITE ${src} "${line}\n")
  execute_process(COMMAND ${CXX} -std=c++20 -fsyntax-only @${rsp} ${src}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(REGEX MATCH "[\"<]([^\">]+)[\">]" _ "${line}")
  set(header "${CMAKE_MATCH_1}")
  if(expect STREQUAL "OK")
    if(rc EQUAL 0)
      message(STATUS "ok    ${target}: ${line} compiles")
    else()
      message(SEND_ERROR "${target}: ${line} should compile:\n${out}")
      set(failed 1)
    endif()
  else()
    string(FIND "${out}" "${header}" mentions)
    if(NOT rc EQUAL 0 AND mentions GREATER -1
       AND out MATCHES "No such file or directory|file not found")
      message(STATUS "ok    ${target}: ${line} is not found")
    else()
      message(SEND_ERROR "${target}: ${line} must fail with 'not found' (rc ${rc}):\n${out}")
      set(failed 1)
    endif()
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "layering_include_test: some include edges are not what docs/architecture.md says")
endif()
