# Layering as a build error (docs/architecture.md, "Rooms and what they may include").
#
# Includes are rooted at the repo ("kernels/ops.h"), but no target outside tests/
# has the repo root on its include path. Instead each target gets an include
# tree of its own under ${PROJECT_BINARY_DIR}/include/<target>/ holding symlinks
# to just the folders (or files) it owns, e.g.
#   build/include/polykv_policies/policies -> <src>/policies
# exported PUBLIC (what its consumers may include too) or PRIVATE (its
# internals). A target sees its own tree plus the trees of the targets it links,
# so what a room may include is exactly what it links; polykv_check_layering()
# then fails the configure when a link (or a hand-written include directory)
# goes against the dependency direction below. tests/unit/layering compiles a
# forbidden include against the real targets' include directories and expects
# "No such file".

# Each room and the rooms it may depend on, transitively closed (a room that
# links another sees everything that one exports PUBLIC).
set(_polykv_allowed_kernels "")
set(_polykv_allowed_policies kernels)
set(_polykv_allowed_proto "")
set(_polykv_allowed_daemon/memory kernels)
set(_polykv_allowed_daemon/log "")
set(_polykv_allowed_daemon/sys "")
set(_polykv_allowed_daemon/compaction kernels policies)
set(_polykv_allowed_daemon/pool daemon/memory daemon/compaction kernels policies)
set(_polykv_allowed_daemon/config daemon/pool daemon/memory daemon/compaction kernels policies)
set(_polykv_allowed_daemon/metrics daemon/pool daemon/memory daemon/compaction daemon/sys kernels
    policies)
set(_polykv_allowed_daemon/rpc daemon/pool daemon/memory daemon/compaction daemon/metrics
    daemon/log daemon/sys proto kernels policies)
set(_polykv_allowed_daemon daemon/rpc daemon/pool daemon/memory daemon/compaction daemon/metrics
    daemon/config daemon/log daemon/sys proto kernels policies)
set(_polykv_allowed_client kernels proto policies)
set(_polykv_allowed_client/worker client kernels proto policies)
# Benchmarks measure everything, the daemon in-process too.
set(_polykv_allowed_bench client/worker client daemon daemon/rpc daemon/pool daemon/memory
    daemon/compaction daemon/metrics daemon/config daemon/log daemon/sys proto kernels policies)

# polykv_room(<target> ROOM <room> [PUBLIC <path>...] [PRIVATE <path>...])
# <target> belongs to <room>; each <path> (a folder or file, relative to the repo
# root) is linked into its include tree under the same relative path.
function(polykv_room target)
  cmake_parse_arguments(R "" "ROOM" "PUBLIC;PRIVATE" ${ARGN})
  if(NOT DEFINED _polykv_allowed_${R_ROOM})
    message(FATAL_ERROR "polykv_room(${target}): unknown room '${R_ROOM}' (cmake/layering.cmake)")
  endif()
  set_property(TARGET ${target} PROPERTY POLYKV_ROOM ${R_ROOM})
  set_property(GLOBAL APPEND PROPERTY POLYKV_ROOM_TARGETS ${target})
  get_target_property(type ${target} TYPE)
  foreach(scope PUBLIC PRIVATE)
    if(NOT R_${scope})
      continue()
    endif()
    set(tree ${PROJECT_BINARY_DIR}/include/${target})
    if(scope STREQUAL "PRIVATE")
      set(tree ${tree}.private)
    endif()
    foreach(p IN LISTS R_${scope})
      if(NOT EXISTS ${PROJECT_SOURCE_DIR}/${p})
        message(FATAL_ERROR "polykv_room(${target}): ${p} does not exist")
      endif()
      get_filename_component(parent ${tree}/${p} DIRECTORY)
      file(MAKE_DIRECTORY ${parent})
      if(NOT IS_SYMLINK ${tree}/${p})
        file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${p} ${tree}/${p} SYMBOLIC)
      endif()
    endforeach()
    if(type STREQUAL "INTERFACE_LIBRARY")
      target_include_directories(${target} INTERFACE ${tree})
    elseif(type STREQUAL "EXECUTABLE")
      target_include_directories(${target} PRIVATE ${tree})
    else()
      target_include_directories(${target} ${scope} ${tree})
    endif()
  endforeach()
endfunction()

# Fails the configure when a room target links a room it may not depend on, or
# puts the source tree (or another target's include tree) on an include path.
function(polykv_check_layering)
  get_property(targets GLOBAL PROPERTY POLYKV_ROOM_TARGETS)
  set(errors "")
  foreach(t IN LISTS targets)
    get_target_property(room ${t} POLYKV_ROOM)
    set(allowed ${room} ${_polykv_allowed_${room}})
    set(links "")
    foreach(prop LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
      get_target_property(v ${t} ${prop})
      if(v)
        list(APPEND links ${v})
      endif()
    endforeach()
    # Generator expressions ($<LINK_ONLY:x>) wrap names: take every word.
    string(REGEX MATCHALL "[A-Za-z0-9_.+-]+" words "${links}")
    list(REMOVE_DUPLICATES words)
    foreach(dep IN LISTS words)
      if(TARGET ${dep})
        get_target_property(dep_room ${dep} POLYKV_ROOM)
        if(dep_room AND NOT dep_room IN_LIST allowed)
          string(APPEND errors "  ${t} (room ${room}) links ${dep} (room ${dep_room}); "
                 "${room} may depend on: ${_polykv_allowed_${room}}\n")
        endif()
      endif()
    endforeach()
    set(dirs "")
    foreach(prop INCLUDE_DIRECTORIES INTERFACE_INCLUDE_DIRECTORIES)
      get_target_property(v ${t} ${prop})
      if(v)
        list(APPEND dirs ${v})
      endif()
    endforeach()
    foreach(d IN LISTS dirs)
      string(REGEX REPLACE "/$" "" d "${d}")
      string(FIND "${d}/" "${PROJECT_BINARY_DIR}/" in_build)
      string(FIND "${d}/" "${PROJECT_SOURCE_DIR}/" in_source)
      if(in_build EQUAL 0)
        # Generated code is fine; another target's include tree is not.
        string(FIND "${d}/" "${PROJECT_BINARY_DIR}/include/" in_trees)
        set(bad OFF)
        if(in_trees EQUAL 0 AND NOT (d STREQUAL "${PROJECT_BINARY_DIR}/include/${t}"
                                     OR d STREQUAL "${PROJECT_BINARY_DIR}/include/${t}.private"))
          set(bad ON)
        endif()
      elseif(in_source EQUAL 0)
        set(bad ON)
        if(t STREQUAL "polykv_client" AND d STREQUAL "${PROJECT_SOURCE_DIR}/client/include")
          set(bad OFF)
        endif()
      else()
        set(bad OFF)
      endif()
      if(bad)
        string(APPEND errors "  ${t} has include directory ${d}: use polykv_room() and link the owner\n")
      endif()
    endforeach()
  endforeach()
  if(errors)
    message(FATAL_ERROR "Layering (docs/architecture.md, cmake/layering.cmake):\n${errors}")
  endif()
endfunction()
