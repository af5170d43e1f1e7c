# polykv_warnings: an interface target every polykv target links, so warning
# flags live in one place.
add_library(polykv_warnings INTERFACE)
target_compile_options(polykv_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers>)
