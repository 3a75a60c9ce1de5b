// Clang's thread-safety annotations (-Wthread-safety), the shape of LevelDB's
// port/thread_annotations.h.  Under clang each macro is the attribute; under other
// compilers it expands to nothing, so gcc builds see plain declarations.
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_);          // read or written only with mu_ held
//   void Bump() REQUIRES(mu_);            // the caller holds mu_
//   void Refresh() EXCLUDES(mu_);         // the caller must not hold mu_ (it takes it)
//
// The annotated lock types are in util/mutex.h; std::mutex carries no capability, so
// members guarded by one cannot be checked.  scripts/run_tests.sh runs the check
// (clang++ -fsyntax-only -Wthread-safety -Werror over every library and tool source).
#ifndef KVENGINE_UTIL_THREAD_ANNOTATIONS_H_
#define KVENGINE_UTIL_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define KV_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define KV_THREAD_ANNOTATION_(x)
#endif

// A type whose objects are locks ("mutex", "shared_mutex").
#define CAPABILITY(x) KV_THREAD_ANNOTATION_(capability(x))
// A RAII type that holds a capability from construction to destruction.
#define SCOPED_CAPABILITY KV_THREAD_ANNOTATION_(scoped_lockable)

// On members: accessed only with the lock held (shared for reads, exclusive for writes).
#define GUARDED_BY(x) KV_THREAD_ANNOTATION_(guarded_by(x))
// On pointer members: the pointee is accessed only with the lock held.
#define PT_GUARDED_BY(x) KV_THREAD_ANNOTATION_(pt_guarded_by(x))
// On lock members: the order in which they are taken.
#define ACQUIRED_BEFORE(...) KV_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) KV_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))

// On functions: the caller holds the lock (exclusively, or at least shared).
#define REQUIRES(...) KV_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) KV_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
// On functions: the caller must not hold the lock (the function takes it).
#define EXCLUDES(...) KV_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// On functions that take or drop a lock and return with it held or released.
#define ACQUIRE(...) KV_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) KV_THREAD_ANNOTATION_(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) KV_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) KV_THREAD_ANNOTATION_(release_shared_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) KV_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
#define TRY_ACQUIRE_SHARED(...) KV_THREAD_ANNOTATION_(try_acquire_shared_capability(__VA_ARGS__))
// On functions that check at run time that the lock is held.
#define ASSERT_CAPABILITY(x) KV_THREAD_ANNOTATION_(assert_capability(x))
#define ASSERT_SHARED_CAPABILITY(x) KV_THREAD_ANNOTATION_(assert_shared_capability(x))
// On functions that return a reference to a lock.
#define RETURN_CAPABILITY(x) KV_THREAD_ANNOTATION_(lock_returned(x))

// Turns the analysis off for one function.  Each use says why in a comment.
#define NO_THREAD_SAFETY_ANALYSIS KV_THREAD_ANNOTATION_(no_thread_safety_analysis)

#endif  // KVENGINE_UTIL_THREAD_ANNOTATIONS_H_
