# polykv_add_test(NAME n SOURCES a.cc... LIBS l... LABELS unit|integration|gpu|soak [TIMEOUT s])
# One GoogleTest executable registered with CTest under its labels. Soak tests
# are excluded from the default suite (tests/run.sh passes -LE soak).
find_package(GTest REQUIRED)
include(GoogleTest)
function(polykv_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gtest_main
                        GTest::gmock polykv_warnings Threads::Threads)
  target_include_directories(${T_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  set_target_properties(${T_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} --gtest_color=no)
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                       ENVIRONMENT "POLYKV_BIN_DIR=${PROJECT_BINARY_DIR}/bin")
  # Integration tests start real processes and wait on leases: they run alone,
  # not beside CPU-heavy unit tests on a 2-core box.
  if("integration" IN_LIST T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()
