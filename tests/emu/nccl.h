/* tests/emu/nccl.h - NCCL for the CUDA emulator: ranks are processes (one rank per
   process and communicator) that meet in POSIX shared memory named from the
   ncclUniqueId; collectives run on the emulated streams (tests/emu/emu_nccl.cpp).

   What it models: blocking and non-blocking init (ncclInProgress until every rank has
   joined), all-reduce, broadcast, reduce, all-gather and reduce-scatter of every type
   and op, in place or not, any size through bounded shared memory, ranks combined in
   rank order (the same bits on every rank; bf16 and fp16 rounded after each addition,
   ncclAvg as NCCL does it: floats pre-multiplied by 1/nranks, integers divided after
   the sum; with one rank NCCL 2.28's out-of-place float average that leaves the last
   few elements unwritten, NCCL issue 1950), ncclCommGetAsyncError, ncclCommFinalize, ncclCommAbort (the rank's queued
   and running collectives end at once, their buffers untouched), ncclCommDestroy,
   ncclGetLastError. A rank that waits for a peer asks that process to run its queued
   work, as a GPU would by itself.
   What it reports (one line and abort): ranks whose collective #k differs (kind,
   count, type, op, root), buffers outside device memory of the communicator's device
   (or mapped pinned memory), partial overlap of send and receive buffers, two ranks
   on one GPU or with one rank number, calls on one communicator from two host threads
   at once (NCCL forbids it), and any call on a communicator after ncclCommAbort or
   ncclCommDestroy. A peer process that died makes the others' async error
   ncclRemoteError (their collectives still wait, as NCCL's kernels do, until the
   caller aborts). A hang stays a hang, as with NCCL: the caller's timeout must act.
   Environment (rank = the communicator's rank, k counts collectives from 1):
     DDP_EMU_NCCL_INPROGRESS=N  init and every collective answer ncclInProgress, and
                                ncclCommGetAsyncError does, for N more polls
     DDP_EMU_NCCL_ERROR=r:k[:code]  collective #k on rank r fails with that ncclResult_t
                                (default 2, ncclSystemError) as its async error
     DDP_EMU_NCCL_HANG=r:k      rank r never arrives at collective #k
     DDP_EMU_NCCL_DELAY_US=N    every NCCL call stays inside the communicator N us
                                longer (widens the window two threads could overlap in)
     DDP_EMU_NCCL_CHUNK=bytes   shared memory per rank (default 1 MiB)
   Not here: groups beyond a single call, ncclCommSplit, send/recv, more than one rank
   per process in one communicator. */
#ifndef EMU_NCCL_H
#define EMU_NCCL_H
#include "cuda_runtime.h"
#include <limits.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_VERSION(X, Y, Z) ((X) <= 2 && (Y) <= 8 ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)
#define NCCL_UNIQUE_ID_BYTES 128

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;
typedef enum {
    ncclInt8 = 0, ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2, ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclNumTypes = 10
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
typedef struct ncclConfig_v21700 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER                                                                              \
    { sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_CONFIG_UNDEF_INT, \
      NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,            \
      NCCL_CONFIG_UNDEF_INT }

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t *config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
#endif
