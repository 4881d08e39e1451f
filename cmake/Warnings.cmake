# adaps_set_warnings(target): -Wall -Wextra on our own code, nowhere else.
function(adaps_set_warnings target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
endfunction()
