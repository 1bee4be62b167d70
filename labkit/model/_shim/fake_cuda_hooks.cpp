#include <c10/core/impl/FakeGuardImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <ATen/detail/CUDAHooksInterface.h>
namespace at {
struct CUDAHooks : public CUDAHooksInterface {
  CUDAHooks(CUDAHooksArgs) {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return false; }
  bool hasCUDA() const override { return false; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return false; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  int getNumGPUs() const override { return 1; }
  c10::DeviceIndex current_device() const override { return 0; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex) const override {}
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex) const override { return 0; }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex) const override { return 0; }
};
C10_REGISTER_CLASS(CUDAHooksRegistry, CUDAHooks, CUDAHooks)
}
C10_REGISTER_GUARD_IMPL(CUDA, c10::impl::FakeGuardImpl<c10::DeviceType::CUDA>);
