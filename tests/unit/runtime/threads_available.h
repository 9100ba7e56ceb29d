// Whether the test process can start threads here (see ThreadsWork).
#ifndef KILN_TESTS_UNIT_RUNTIME_THREADS_AVAILABLE_H_
#define KILN_TESTS_UNIT_RUNTIME_THREADS_AVAILABLE_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

// Whether a thread can be started here. Under qemu-user with a mismatched guest glibc
// (the cross sysroot's ld.so loading the system's multiarch libc.so.6 of another
// revision; cmake/toolchains/aarch64-linux-clang.cmake avoids it) pthread_create never
// returns; a forked child tries, so that a test fails or skips instead of hanging.
inline bool ThreadsWork() {
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    std::thread t([] {});
    t.join();
    _exit(0);
  }
  for (int i = 0; i < 100; ++i) {  // 5 s
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return false;
}

#endif  // KILN_TESTS_UNIT_RUNTIME_THREADS_AVAILABLE_H_
