/* C API of the adaps worker library, for other languages (Python ctypes, Julia, ...).
 *
 * Every function returns an absl::StatusCode value (0 = OK; 3 invalid argument, 4 deadline
 * exceeded, 9 failed precondition, 14 unavailable, 15 data loss). The message of the last
 * error on a handle is kept per handle: adaps_worker_last_error. Operations are blocking
 * (push-pull waits for its answer); thread-safety as adaps::Worker. Never aborts. */
#ifndef ADAPS_C_H_
#define ADAPS_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct adaps_worker adaps_worker;

/* compression: 0 dense, 1 adacomp, 2 topk, 3 sign.
 * pull_format: 0 dense, 1 recompressed, 2 sparse. */
typedef struct {
  const char* name;
  const int64_t* shape;
  size_t ndim;
  uint32_t bin_size;
  int compression;
  double topk_fraction;
  int pull_format;
} adaps_tensor_spec;

/* Connects to the scheduler. request_timeout_ms > 0 bounds every request and the wait for
 * the cluster to form (default 30 s / 60 s). On failure returns NULL and, when `error` is not NULL, writes
 * a NUL-terminated message of at most error_size bytes. */
adaps_worker* adaps_worker_create(const char* scheduler, int request_timeout_ms,
                                  char* error, size_t error_size);
/* Stops (leaves the cluster) and frees. NULL is allowed. */
void adaps_worker_destroy(adaps_worker* worker);

int adaps_worker_rank(const adaps_worker* worker);
int adaps_worker_num_workers(const adaps_worker* worker);
/* The servers' --optimizer ("mean": a pull answers the step's mean gradient; "sgd",
 * "momentum", "nesterov", "adam": it answers parameters; "sum"), "" when they did not say.
 * Valid until adaps_worker_destroy. */
const char* adaps_worker_server_optimizer(const adaps_worker* worker);
/* The message of the handle's last error: a copy for the calling thread, valid until this
 * thread calls adaps_worker_last_error again (another thread's error does not change it). */
const char* adaps_worker_last_error(const adaps_worker* worker);

int adaps_worker_declare(adaps_worker* worker, const adaps_tensor_spec* spec, float* values,
                         size_t count);
int adaps_worker_push_pull(adaps_worker* worker, const char* name, const float* grad,
                           float* out, size_t count);
/* A tensor on a CUDA device (adaps::TensorSpec::device): declared with the device's ordinal
 * (`values` in host memory, as adaps_worker_declare), then pushed and pulled with device
 * pointers and the caller's stream (a cudaStream_t; NULL: the default stream). Its residues
 * live on the device and its pushes are compressed there. 12 (unimplemented) when the library
 * was built without CUDA, 14 (unavailable) without a usable GPU, 3 for a tensor in host
 * memory given to push_pull_device (or one on a device given to push_pull). */
int adaps_worker_declare_on_device(adaps_worker* worker, const adaps_tensor_spec* spec,
                                   int device, float* values, size_t count);
int adaps_worker_push_pull_device(adaps_worker* worker, const char* name, const float* grad,
                                  float* out, size_t count, void* stream);
/* The servers' parameters of `name` as of their last completed step, exactly (a dense pull;
 * the replica behind recompressed pulls is left alone): adaps::Worker::PullParameters. */
int adaps_worker_pull_parameters(adaps_worker* worker, const char* name, float* out,
                                 size_t count);
int adaps_worker_barrier(adaps_worker* worker);
/* The AdaComp bin size of this worker's pushes of `name` from the next push on (the residue
 * is kept): adaps::Worker::SetBinSize. */
int adaps_worker_set_bin_size(adaps_worker* worker, const char* name, uint32_t bin_size);
int adaps_worker_set_hyper(adaps_worker* worker, const char* name, double value);
/* Traffic of one tensor: bytes on the wire and dense-equivalent bytes, pushes and pulls. */
int adaps_worker_traffic(const adaps_worker* worker, const char* name, uint64_t* wire_bytes,
                         uint64_t* dense_bytes);

/* Local steps (adaps/local_steps.h; servers --optimizer=mean): call
 * adaps_worker_local_steps once, before declaring; every tensor adaps_worker_declare declares
 * afterwards keeps the values it comes back with as its anchor. Every `H` steps of the
 * trainer's own optimizer, adaps_worker_exchange for each tensor (collective, blocking)
 * pushes params - anchor and writes anchor + the outer step of the workers' mean change into
 * `params`. outer: 0 the mean change itself, 1 DiLoCo's Nesterov outer step (rate 0.7,
 * momentum 0.9). 9 (failed precondition) when the servers do not run mean or when called
 * after a declaration. */
int adaps_worker_local_steps(adaps_worker* worker, int outer);
int adaps_worker_exchange(adaps_worker* worker, const char* name, float* params, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* ADAPS_C_H_ */
