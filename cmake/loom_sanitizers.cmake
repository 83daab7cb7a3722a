# LOOM_SANITIZE=address: AddressSanitizer + UndefinedBehaviorSanitizer for everything.
# LOOM_SANITIZE=thread:  ThreadSanitizer (the executor and the pools are built for it).
# Flags are global so that every target, tests and tools included, is instrumented alike;
# CUDA kernels (.cu, nvcc) are not: device code cannot be instrumented, and their host side
# is only launch stubs. The CUDA backend's host code (.cpp) is.
if(LOOM_SANITIZE STREQUAL "address")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=address,undefined>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-sanitize-recover=undefined>)
  add_link_options(-fsanitize=address,undefined)
  add_compile_definitions(LOOM_ASAN=1)
elseif(LOOM_SANITIZE STREQUAL "thread")
  add_compile_options($<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=thread>
                      $<$<COMPILE_LANGUAGE:CXX,C>:-fno-omit-frame-pointer>)
  add_link_options(-fsanitize=thread)
  add_compile_definitions(LOOM_TSAN=1)
elseif(NOT LOOM_SANITIZE STREQUAL "")
  message(FATAL_ERROR "LOOM_SANITIZE must be '', 'address' or 'thread', not '${LOOM_SANITIZE}'")
endif()
