/* Operand staging for harness programs (the conformance body, `tpflex demo`): matrices in the
 * memory a backend computes on, with a host mirror the reference reads, moved through a rank
 * environment (rank_env.h), and the transfers into and out of a communicator's registration.
 * Every function takes the environment and the calling rank; nothing here knows the backend. */
#ifndef TPF_STAGING_H
#define TPF_STAGING_H

#include "rank_env.h"

#include <stddef.h>
#include <stdint.h>

/* A matrix in backend memory (dev) and its host mirror (host): same rows, cols, ld and dtype. */
typedef struct {
  tpf_matrix dev, host;
  size_t bytes; /* rows * ld elements */
} tpf_stage_mat;

/* Allocates both halves, the host one zeroed. TPF_ENOMEM (nothing is left allocated). */
tpf_status tpf_stage_new(tpf_conf_env *env, int rank, tpf_stage_mat *m, uint64_t rows,
                         uint64_t cols, uint64_t ld, tpf_dtype dt);
/* Frees both halves and zeroes *m; a zeroed *m is a no-op. */
void tpf_stage_free(tpf_conf_env *env, int rank, tpf_stage_mat *m);
/* Copies the first `rows` rows (rows * ld elements, padding included) host -> backend, or
 * backend -> host. The environment's status. */
tpf_status tpf_stage_upload(tpf_conf_env *env, int rank, tpf_stage_mat *m, uint64_t rows);
tpf_status tpf_stage_download(tpf_conf_env *env, int rank, tpf_stage_mat *m, uint64_t rows);

/* A zeroed host matrix rows x cols (ld = cols) of dtype dt; free(m->ptr). TPF_ENOMEM. */
tpf_status tpf_stage_host_new(tpf_matrix *m, uint64_t rows, uint64_t cols, tpf_dtype dt);
/* Rows [r0, r0 + n) of m as a view (same ld). */
tpf_matrix tpf_stage_rows(const tpf_matrix *m, uint64_t r0, uint64_t n);
/* The rows x cols top-left corner of m as a view (same ld): an active view of a capacity one. */
tpf_matrix tpf_stage_view(const tpf_matrix *m, uint64_t rows, uint64_t cols);

/* Writes this rank's shard (rows [rank*R, (rank+1)*R) of the host matrix x, R = the local
 * chunk's rows) into the communicator's local chunk. */
tpf_status tpf_stage_put_local(tpf_conf_env *env, int rank, tpf_comm *c, const tpf_matrix *x);
/* Writes the host matrix x (the active shape, ld = cols, the buffer dtype) over the whole active
 * buffer: a rank's partial before a bulk reduce-scatter. */
tpf_status tpf_stage_put_buffer(tpf_conf_env *env, int rank, tpf_comm *c, const tpf_matrix *x);
/* Downloads the active buffer (tpf_comm_buffer) into a new host matrix *host (free(host->ptr));
 * *host is written only on success. TPF_ENOMEM or the environment's status. */
tpf_status tpf_stage_get_buffer(tpf_conf_env *env, int rank, tpf_comm *c, tpf_matrix *host);

#endif /* TPF_STAGING_H */
