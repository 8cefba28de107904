/* bench/floor/nolibc.c: a static program without any C library, exiting at once. Its exec
 * against a static C program doing nothing (`int main(void) { return 0; }`) is what the C
 * library's start-up costs every C or Rust plugin: in a VM, glibc's probes of the CPU
 * (`cpuid`, which traps to the hypervisor) take most of it (bench/floor/cpuid.c).
 * Built with `gcc -O2 -static -nostdlib`. */
void _start(void)
{
	__asm__ volatile("mov $60, %eax\n\txor %edi, %edi\n\tsyscall");
}
