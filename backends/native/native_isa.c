/* The instruction sets this build of the library was compiled for (-march=native and any
 * -mno-* flags), as bits, so the probe can say which code path each kernel family runs:
 * the kernels choose their paths by these same macros when they are compiled. */
int tsr_native_isa(void) {
    int bits = 0;
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    bits |= 1;
#endif
#if defined(__AVX512F__)
    bits |= 2;
#endif
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    bits |= 4;
#endif
#if defined(__AVXVNNI__) || (defined(__AVX512VNNI__) && defined(__AVX512VL__))
    bits |= 8;
#endif
#if defined(__AVX512BF16__)
    bits |= 16;
#endif
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
    bits |= 32;
#endif
    return bits;
}
