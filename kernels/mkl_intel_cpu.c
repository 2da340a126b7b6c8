/* MKL's test of the processor's vendor, answered "Intel" (1).
 *
 * MKL, linked into torch's CPU wheel, picks its kernels by the vendor as well as the instruction sets, and on
 * a processor not made by Intel takes others than on an Intel one with the same AVX-512: sums round
 * otherwise, and SGLD's chains carry the difference into other samples. Preloaded (LD_PRELOAD; `make ...
 * KERNELS=intel` builds and preloads it), this test is the one MKL calls, so that it takes the kernels it
 * takes on an Intel processor with the same instruction sets; MKL still picks those by what the processor
 * supports. apd/pipeline/kernels.py reports which kernels a run took.
 */
int mkl_serv_intel_cpu_true(void) { return 1; }
