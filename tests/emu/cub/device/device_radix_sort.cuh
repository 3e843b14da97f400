/* tests/emu/cub/device/device_radix_sort.cuh - CUB's DeviceRadixSort::SortPairs and
   SortKeys for the CUDA emulator, with CUB's two-call protocol: a NULL temp storage
   asks for its size; the real call checks that the temp storage, the keys and the
   values lie in device memory of the current device, that temp storage is as large as
   the first call said and overlaps no other buffer, then queues a stable sort on the
   key bits [begin_bit, end_bit) (signed integer keys in numeric order, as CUB orders
   them) and leaves garbage in the temp storage (tests/emu/emu_blas.cpp). */
#ifndef EMU_CUB_DEVICE_RADIX_SORT_CUH
#define EMU_CUB_DEVICE_RADIX_SORT_CUH
#include "../../cuda_runtime.h"

namespace emu {
cudaError_t radix_sort(void *temp, size_t *temp_bytes, const void *keys_in, void *keys_out, size_t key_size,
                       bool key_signed, const void *values_in, void *values_out, size_t value_size, long long n,
                       int begin_bit, int end_bit, cudaStream_t stream);
}

namespace cub {
struct DeviceRadixSort {
    template <class K, class V, class N>
    static cudaError_t SortPairs(void *d_temp_storage, size_t &temp_storage_bytes, const K *d_keys_in, K *d_keys_out,
                                 const V *d_values_in, V *d_values_out, N num_items, int begin_bit = 0,
                                 int end_bit = (int)sizeof(K) * 8, cudaStream_t stream = 0)
    {
        static_assert(std::is_integral<K>::value, "the emulated radix sort takes integer keys");
        return emu::radix_sort(d_temp_storage, &temp_storage_bytes, d_keys_in, d_keys_out, sizeof(K),
                               std::is_signed<K>::value, d_values_in, d_values_out, sizeof(V), (long long)num_items,
                               begin_bit, end_bit, stream);
    }
    template <class K, class N>
    static cudaError_t SortKeys(void *d_temp_storage, size_t &temp_storage_bytes, const K *d_keys_in, K *d_keys_out,
                                N num_items, int begin_bit = 0, int end_bit = (int)sizeof(K) * 8, cudaStream_t stream = 0)
    {
        static_assert(std::is_integral<K>::value, "the emulated radix sort takes integer keys");
        return emu::radix_sort(d_temp_storage, &temp_storage_bytes, d_keys_in, d_keys_out, sizeof(K),
                               std::is_signed<K>::value, NULL, NULL, 0, (long long)num_items, begin_bit, end_bit,
                               stream);
    }
};
} // namespace cub
#endif
