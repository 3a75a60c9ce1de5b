// FUZZ_CHECK: a property a fuzz target asserts on every input.  A failure prints what
// broke and aborts, which libFuzzer reports as a crash and saves the input.
#ifndef KVENGINE_TEST_FUZZ_FUZZ_CHECK_H_
#define KVENGINE_TEST_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_CHECK(cond, what)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                              \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

#endif  // KVENGINE_TEST_FUZZ_FUZZ_CHECK_H_
