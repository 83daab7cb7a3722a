# loom_set_warnings(target): the warning set every loom target builds with.
# -Wno-missing-field-initializers: designated initializers that leave members at their
# defaults ({.name = "h1"}) are the intended use of option structs.
function(loom_set_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
      -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough
      -Wno-missing-field-initializers>
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Wpedantic>)
  if(LOOM_WERROR)
    # nvcc spells it differently; CUDA sources (kernels) get its own form.
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX,C>:-Werror>
                           $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings>)
  endif()
endfunction()
