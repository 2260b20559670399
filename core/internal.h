/* Private declarations of the core: layout internals, the backend wrappers, the planner and the
 * test hooks. Nothing here is part of the public API. The error macros (TPF_CHECK, TPF_RETURN_IF),
 * the checked arithmetic, the allocator, the struct-size check and the live-object table are the
 * backends' too: they live in the public tpflex/tpflex_backend_support.h, and the core calls them
 * by the older names below as well. */
#ifndef TPF_INTERNAL_H
#define TPF_INTERNAL_H

#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_backend_support.h"
#include "tpflex/tpflex_cost.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- alloc.c: the hookable allocator (tpf_malloc ... of the support header) ---- */
#define tpf__malloc tpf_malloc
#define tpf__calloc tpf_calloc
#define tpf__realloc tpf_realloc
#define tpf__free tpf_free
char *tpf__strdup(const char *s);
/* Test hooks: allocations currently live, and a budget after which every allocation fails
 * (-1 = unlimited). Thread-safe (C11 atomics). */
long tpf__alloc_live_count(void);
void tpf__alloc_set_budget(long allocations_left);

/* ---- checked arithmetic (the support header's) ---- */
#define tpf__add_u64 tpf_add_u64
#define tpf__mul_u64 tpf_mul_u64
#define tpf__mul3_u64 tpf_mul3_u64

/* ---- status.c ---- */
/* Clears the calling thread's detail. */
void tpf__clear_error(void);

/* Versioned structs: tpf_check_struct_size of the support header. */
#define tpf__check_struct_size tpf_check_struct_size

/* ---- handle.c: the table of live objects (tpf_handle_* of the support header) ---- */
#define tpf__handle_add tpf_handle_add
#define tpf__handle_remove tpf_handle_remove
#define tpf__handle_live tpf_handle_live
#define tpf__handle_check tpf_handle_check
const char *tpf__handle_kind_name(int kind);
/* Live handles of every kind (tests). */
size_t tpf__handle_count(void);

/* ---- layout.c ---- */
/* tpf_layout_check with an explicit alignment (the backend's); 0 means 1. */
tpf_status tpf__layout_check_align(const tpf_layout_desc *d, uint64_t align_bytes);
/* Everything a schedule build reads of a layout, from one validation: the
 * chunks/slots/blocks of the active layout (as tpf_layout_chunk), the local shard, the
 * registered and active bytes. align_bytes as tpf__layout_check_align. */
typedef struct {
  int count;
  tpf_region chunk[2 * TPF_MAX_RANKS > TPF_MAX_SPLITS ? 2 * TPF_MAX_RANKS : TPF_MAX_SPLITS];
  tpf_region local;
  tpf_region buffer; /* the whole active buffer (tpf_comm_buffer): offset 0, every slot */
  uint64_t registered_bytes, active_bytes;
} tpf_layout_geom;
tpf_status tpf__layout_geometry(const tpf_layout_desc *d, uint64_t align_bytes,
                                tpf_layout_geom *out);
/* Layout validations (every rule of SPEC §3 run once) made by the calling thread so far. */
uint64_t tpf__layout_validations(void);
/* The ring-RS slot rule (layout.c, its one home): the chunk slots a non-pipeline layout names
 * (2P-1 for RING RS, else P) and the slot of this rank's shard (P-1 for RING RS, else rank). */
int tpf__layout_slots(const tpf_layout_desc *d);
int tpf__layout_local_slot(const tpf_layout_desc *d);
/* The split count a descriptor resolves to (num_splits, or its default). d must be valid. */
int tpf__layout_splits(const tpf_layout_desc *d);
/* True for fp8 dtypes (1-byte elements; they follow the active shape like any other, SPEC §11). */
bool tpf__dtype_quantized(tpf_dtype t);
/* fp8_e4m3 or fp8_e5m2 (core/operands.c). */
bool tpf__fp8_dtype(tpf_dtype t);

/* ---- schedule.c ---- */
/* Steps reserved for any schedule of a communicator of d's configuration and capacity (any
 * active shape T <= C and any split count it may resolve to); 0 for a bad descriptor. */
int tpf__schedule_max_steps(const tpf_layout_desc *d);
/* Fills each step's transport class and SM budget and the schedule's handshake peers from the
 * mechanism table (core/schedule_mech.c); every builder calls it on the schedule it made. */
void tpf__schedule_mechanisms(tpf_schedule *s);
/* tpf_schedule_build into caller-owned storage of storage_cap steps: allocates nothing;
 * s->steps points at storage (do not tpf_schedule_free it). TPF_ESTATE when it does not fit. */
tpf_status tpf__schedule_build_into(const tpf_layout_desc *d, const tpf_gemm_dims *g,
                                    tpf_step *storage, int storage_cap, tpf_schedule *s);

/* ---- backend.c: the only call path from the core into a backend ---- */
tpf_status tpf__be_validate(const tpf_backend *be);
tpf_status tpf__be_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                              void **local);
tpf_status tpf__be_reg_destroy(tpf_backend *be, tpf_reg *reg);
tpf_status tpf__be_reg_activate(tpf_backend *be, tpf_reg *reg, uint64_t active_bytes);
/* One call into a rank's backend at a time (core/backend.c): every core call that reaches the
 * backend from the rank's thread (an operation, a shape change, sync, creation, destroy) claims
 * be first; TPF_ESTATE naming the rule, `call` and `comm` (either may be NULL) when another
 * thread holds it, before anything changed. *claimed says whether tpf__be_release must follow
 * (false only when the table is full: the backend's own guard is left to refuse). */
tpf_status tpf__be_claim(const tpf_backend *be, const char *call, const char *comm, bool *claimed);
void tpf__be_release(const tpf_backend *be);
/* Validates the operation (tpf__exec_check against the registration's reg_bytes), then runs it. */
tpf_status tpf__be_execute(tpf_backend *be, tpf_reg *reg, uint64_t reg_bytes,
                           const tpf_exec_args *a, void *stream);
/* core/exec_check.c: the structural rules every schedule obeys before a backend sees it. */
tpf_status tpf__exec_check(const tpf_exec_args *a, uint64_t reg_bytes);
tpf_status tpf__be_sync(tpf_backend *be, void *stream);
/* Optional ops, NULL when the table's version predates them. */
tpf_status (*tpf__be_reg_sync_op(const tpf_backend *be))(tpf_backend *, tpf_reg *);
tpf_status (*tpf__be_reg_async_error_op(const tpf_backend *be))(tpf_backend *, tpf_reg *,
                                                                tpf_status *);
tpf_status (*tpf__be_reg_abort_op(const tpf_backend *be))(tpf_backend *, tpf_reg *);
tpf_status (*tpf__be_allgather_op(const tpf_backend *be))(tpf_backend *, const void *, void *,
                                                          size_t);
/* The capability bits the core honours for this backend (TPF_BE_CAP_OPTIONS only from ABI 2). */
unsigned tpf__be_caps(const tpf_backend *be);

/* ---- cost.c: time of one transfer, latency + bytes over bandwidth (microseconds) ---- */
double tpf__cost_link_us(const tpf_cost_link *l, double bytes);
/* TPF_EINVAL naming the line to add when the table lacks the link that prices `kind`:
 * TPF_STEP_SEND the peer copy, TPF_STEP_REDUCE the reduction, TPF_STEP_KIND_COUNT the local copy.
 */
tpf_status tpf__cost_link_check(const tpf_cost_table *t, tpf_step_kind kind);
/* FNV-1a over every field of the table that prices something, sched points included (the
 * configuration fingerprint's cost_hash: ranks with different tables refuse to agree). */
uint64_t tpf__cost_table_hash(const tpf_cost_table *t);
/* The sched points of key's (shared, algo, coll, tp_size, num_splits, aggregate, dtype, hidden,
 * n): returns how many there are; *lo gets the one of the largest rows <= key->rows and *hi the
 * one of the smallest rows >= key->rows (the same index at a measured T), -1 where none. */
int tpf__cost_sched_bracket(const tpf_cost_table *t, const tpf_cost_sched_point *key, int *lo,
                            int *hi);

/* ---- plan.c: an adaptive communicator's planner (NULL for a FIXED one) ---- */
typedef struct tpf_planner tpf_planner;
/* *out NULL for TPF_PLAN_FIXED; cap: the communicator's layout at capacity. */
tpf_status tpf__planner_create(const tpf_comm_config *cfg, const tpf_layout_desc *cap,
                               tpf_planner **out);
void tpf__planner_destroy(tpf_planner *p);
const tpf_cost_table *tpf__planner_table(const tpf_planner *p);
/* Sets d's num_splits and aggregate to the cached or newly planned choice for an operation
 * whose x (gemm_rs x) is x_dtype (tpf_plan_predict_x); allocates nothing. */
tpf_status tpf__planner_apply(tpf_planner *p, tpf_layout_desc *d, const tpf_gemm_dims *g,
                              tpf_dtype x_dtype);
tpf_status tpf__planner_last(const tpf_planner *p, tpf_plan_result *out);

#endif /* TPF_INTERNAL_H */
