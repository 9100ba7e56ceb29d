// kiln_shared_budget_*: several models under one memory budget, loaded when acquired
// and unloaded least recently used first when another needs their room.
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>

#include "model.h"
#include "support/error.h"
#include "support/sized_struct.h"

using namespace kiln::rt;

namespace {

struct Entry {
  char* path = nullptr;
  kiln_model_options_t options = {};
  kiln_session_options_t session = {};  // options.session points here when given
  uint64_t bytes = 0;                   // what it counts against the budget
  kiln_model_t* model = nullptr;
  int32_t holds = 0;
  uint64_t last_used = 0;
};

// What a loaded model counts: kiln_model_memory_report's total for one session of
// the options it was loaded with.
kiln_status_t CountedBytes(const kiln_model_t* model, uint64_t* out, kiln_error_t* error) {
  kiln_memory_report_t r = {};
  r.struct_size = sizeof(r);
  if (kiln_status_t st = kiln_model_memory_report(model, model->budget_session_given ? &model->budget_session : nullptr,
                                                  &r, error);
      st != KILN_OK)
    return st;
  *out = r.total_bytes;
  return KILN_OK;
}

}  // namespace

struct kiln_shared_budget_t {
  uint64_t bytes = 0;
  std::mutex mu;
  Allocator allocator;
  Vec<Entry> entries{&allocator};
  uint64_t clock = 0;
  int32_t loads = 0, unloads = 0;

  uint64_t Used() const {
    uint64_t used = 0;
    for (const Entry& e : entries)
      if (e.model != nullptr) used += e.bytes;
    return used;
  }
};

extern "C" {

kiln_status_t kiln_shared_budget_create(uint64_t bytes, kiln_shared_budget_t** out_budget, kiln_error_t* out_error) {
  ClearError(out_error);
  if (bytes == 0 || out_budget == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_shared_budget_create: a budget of bytes > 0 and out_budget");
  Allocator bootstrap(nullptr);
  void* mem = bootstrap.Alloc(sizeof(kiln_shared_budget_t), 64);
  if (mem == nullptr) return Fail(out_error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
  kiln_shared_budget_t* b = new (mem) kiln_shared_budget_t();
  b->bytes = bytes;
  *out_budget = b;
  return KILN_OK;
}

void kiln_shared_budget_release(kiln_shared_budget_t* b) {
  if (b == nullptr) return;
  for (Entry& e : b->entries) {
    kiln_model_release(e.model);
    b->allocator.Free(e.path);
  }
  b->entries.set_allocator(nullptr);
  b->~kiln_shared_budget_t();
  Allocator(nullptr).Free(b);
}

kiln_status_t kiln_shared_budget_add(kiln_shared_budget_t* b, const char* path, const kiln_model_options_t* options,
                                     int32_t* out_id, kiln_error_t* out_error) {
  ClearError(out_error);
  if (b == nullptr || path == nullptr || out_id == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_shared_budget_add: budget, path and out_id are required");
  Entry e;
  kiln_model_options_init(&e.options);
  if (options != nullptr) {
    if (options->struct_size < sizeof(uint32_t) || options->struct_size > 4096)
      return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_model_options_t.struct_size is not set");
    std::memcpy(&e.options, options, std::min<size_t>(options->struct_size, sizeof(e.options)));
    e.options.struct_size = sizeof(e.options);
  }
  if (e.options.session != nullptr) {
    const kiln_session_options_t* so = e.options.session;
    if (so->struct_size < sizeof(uint32_t) || so->struct_size > 4096)
      return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_session_options_t.struct_size is not set");
    std::memcpy(&e.session, so, std::min<size_t>(so->struct_size, sizeof(e.session)));
    e.session.struct_size = sizeof(e.session);
    e.session.pressure_policy = nullptr;  // the budget counts memory; the sessions bring their policies
    e.options.session = nullptr;          // set to the entry's copy when loading
  }
  const bool has_session = options != nullptr && options->session != nullptr;
  std::lock_guard<std::mutex> lock(b->mu);
  // Loaded once: verified, and measured against the whole budget.
  kiln_model_options_t load = e.options;
  if (has_session) load.session = &e.session;
  kiln_model_t* model = nullptr;
  if (kiln_status_t st = LoadModelFile(path, &load, b->bytes, false, &model, out_error); st != KILN_OK) return st;
  kiln_status_t st = CountedBytes(model, &e.bytes, out_error);
  kiln_model_release(model);
  if (st != KILN_OK) return st;
  const size_t n = std::strlen(path) + 1;
  e.path = static_cast<char*>(b->allocator.Alloc(n, 16));
  if (e.path == nullptr || !b->entries.push_back(e)) {
    b->allocator.Free(e.path);
    return Fail(out_error, KILN_ERROR_OUT_OF_MEMORY, "out of memory");
  }
  std::memcpy(b->entries.back().path, path, n);
  if (has_session) b->entries.back().options.session = &b->entries.back().session;  // the copy's
  // Entries move when the vector grows: every session pointer points into its own entry.
  for (Entry& x : b->entries)
    if (x.options.session != nullptr) x.options.session = &x.session;
  *out_id = static_cast<int32_t>(b->entries.size() - 1);
  return KILN_OK;
}

kiln_status_t kiln_shared_budget_acquire(kiln_shared_budget_t* b, int32_t id, kiln_model_t** out_model,
                                         kiln_error_t* out_error) {
  ClearError(out_error);
  if (b == nullptr || out_model == nullptr)
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "kiln_shared_budget_acquire: budget and out_model are required");
  std::lock_guard<std::mutex> lock(b->mu);
  if (id < 0 || static_cast<size_t>(id) >= b->entries.size())
    return Fail(out_error, KILN_ERROR_INVALID_ARGUMENT, "no model %d in the shared budget (%zu added)", id,
                b->entries.size());
  Entry& e = b->entries[static_cast<size_t>(id)];
  e.last_used = ++b->clock;
  if (e.model == nullptr) {
    // Loaded with the room left (a tiered artifact takes the largest tier that fits
    // it); while it does not fit, the least recently used model nobody holds goes.
    for (;;) {
      kiln_model_t* model = nullptr;
      kiln_status_t st = LoadModelFile(e.path, &e.options, b->bytes - b->Used(), false, &model, out_error);
      if (st == KILN_OK) {
        e.model = model;
        ++b->loads;
        if (CountedBytes(model, &e.bytes, out_error) != KILN_OK) e.bytes = 0;  // measured at add: cannot fail now
        ClearError(out_error);
        break;
      }
      if (st != KILN_ERROR_RESOURCE_EXHAUSTED) return st;
      Entry* lru = nullptr;
      for (Entry& x : b->entries)
        if (x.model != nullptr && x.holds == 0 && (lru == nullptr || x.last_used < lru->last_used)) lru = &x;
      if (lru == nullptr) {
        char held[320] = "";
        size_t at = 0;
        for (const Entry& x : b->entries)
          if (x.model != nullptr && at < sizeof(held))
            at += static_cast<size_t>(std::snprintf(held + at, sizeof(held) - at, "%s%s (%.1f MB, %d holds)",
                                                    at == 0 ? "" : ", ", x.path, x.bytes / 1e6, x.holds));
        return Fail(out_error, KILN_ERROR_RESOURCE_EXHAUSTED,
                    "%s does not fit the %.1f MB left of the %.1f MB shared budget; the models in use hold %.1f MB: "
                    "%s",
                    e.path, (b->bytes - b->Used()) / 1e6, b->bytes / 1e6, b->Used() / 1e6, held);
      }
      kiln_model_release(lru->model);
      lru->model = nullptr;
      ++b->unloads;
    }
  }
  ++e.holds;
  *out_model = e.model;
  return KILN_OK;
}

kiln_status_t kiln_shared_budget_return(kiln_shared_budget_t* b, int32_t id) {
  if (b == nullptr) return KILN_ERROR_INVALID_ARGUMENT;
  std::lock_guard<std::mutex> lock(b->mu);
  if (id < 0 || static_cast<size_t>(id) >= b->entries.size() || b->entries[static_cast<size_t>(id)].holds == 0)
    return KILN_ERROR_INVALID_ARGUMENT;
  --b->entries[static_cast<size_t>(id)].holds;
  return KILN_OK;
}

kiln_status_t kiln_shared_budget_get_info(kiln_shared_budget_t* b, int32_t id, kiln_shared_budget_info_t* out_info) {
  if (b == nullptr) return KILN_ERROR_INVALID_ARGUMENT;
  std::lock_guard<std::mutex> lock(b->mu);
  if (id >= 0 && static_cast<size_t>(id) >= b->entries.size()) return KILN_ERROR_INVALID_ARGUMENT;
  kiln_shared_budget_info_t info = {};
  info.struct_size = sizeof(info);
  info.budget_bytes = b->bytes;
  info.used_bytes = b->Used();
  info.models = static_cast<int32_t>(b->entries.size());
  for (const Entry& e : b->entries) info.loaded += e.model != nullptr;
  info.loads = b->loads;
  info.unloads = b->unloads;
  if (id >= 0) {
    const Entry& e = b->entries[static_cast<size_t>(id)];
    info.model_loaded = e.model != nullptr;
    info.model_holds = e.holds;
    info.model_bytes = e.bytes;
  }
  if (!CopySizedOut(info, out_info)) return KILN_ERROR_INVALID_ARGUMENT;
  return KILN_OK;
}

}  // extern "C"
