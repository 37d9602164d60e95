// The tag of this build configuration, the inline namespace everything in cutrain lives in
// (`namespace cutrain::inline CUTRAIN_ABI`), as fmt does with its version. Inline functions and
// templates differ between translation units compiled with and without CUTRAIN_WITH_CUDA (an
// op's CUDA path, an optimizer's capture hooks); with the tag in every mangled name, a program
// that mixes the two fails to link instead of running whichever copy the linker kept.
// tests/link_check shows it: a function taking a Tensor, defined in one configuration and
// called from the other, is an undefined reference.
#pragma once

#ifdef CUTRAIN_WITH_CUDA
#define CUTRAIN_ABI cuda_on
#else
#define CUTRAIN_ABI cuda_off
#endif
