#![no_std]
#![no_main]
// Placeholder until the datapath issue lands its programs.
#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
