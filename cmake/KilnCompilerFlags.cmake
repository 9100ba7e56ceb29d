# Warning and sanitizer flags shared by every Kiln target.

if(CMAKE_C_COMPILER_ID MATCHES "Clang|GNU")
  add_compile_options(-Wall -Wextra -Wno-unused-parameter)
endif()

if(KILN_SANITIZE)
  set(_kiln_san -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
  add_compile_options(${_kiln_san})
  add_link_options(${_kiln_san})
endif()

# kiln_runtime_target(<target>): flags for code that ships inside an app. No
# exceptions or RTTI cross the C ABI; the runtime reports every failure by status.
function(kiln_runtime_target target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-fno-exceptions -fno-rtti>
    -fvisibility=hidden)
endfunction()
