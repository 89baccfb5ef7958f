//! A faithful port of PyTorch's native CUDA caching allocator
//! (c10/cuda/CUDACachingAllocator.cpp, 2.6 behaviour by default) over [`crate::device::Device`].

pub mod sizes;
