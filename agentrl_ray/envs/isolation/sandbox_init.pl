# The launcher and PID-namespace init of a sandboxed run (see sandbox.py). It starts as root inside the run's new
# mount, IPC, PID and network namespaces and, in one process (no shell, no `mount` binary: each exec costs ~2 ms
# of CPU per run):
#   1. joins the run's cgroups (writes 0, "this process", to each cgroup.procs file);
#   2. mounts a fresh tmpfs on /tmp, /var/tmp and /dev/shm (mount(2) directly where its number is known);
#   3. copies the staged working directory (its cwd) into the private /tmp and changes into it;
#   4. runs the program (setpriv ... prlimit ... argv) as its child, reaps orphans until the program exits, and
#      writes the program's raw wait status to STATUS_FD, a pipe the program never sees.
# The init, not the program, is pid 1: the kernel ignores default-action signals sent to a namespace's init
# (SIGXCPU, SIGXFSZ, its own SIGTERM), and a shell or `timeout` as init reports a death by signal n as exit 128+n.
# When this process exits, the kernel kills whatever is left in the namespace.
#
# Usage: perl sandbox_init.pl STATUS_FD MOUNT_SYSCALL TMPFS_OPTIONS WORKDIR [CGROUP_PROCS...] -- PROGRAM...
my ($fd, $nr, $opts, $workdir) = splice(@ARGV, 0, 4);
while ((my $procs = shift @ARGV) ne '--') {
    open(my $h, '>', $procs) or die "sandbox init: cannot join $procs: $!\n";
    print $h "0";
    close($h) or die "sandbox init: cannot join $procs: $!\n";
}
my ($source, $fstype) = ('agentrl-sandbox', 'tmpfs');  # syscall() wants variables, not literals
# Flags 6 = MS_NOSUID | MS_NODEV: a setuid file or a device node planted in the tmpfs gains nothing.
for my $name ('/tmp', '/var/tmp', '/dev/shm') {
    my $dir = $name;
    if ($nr > 0) {
        syscall($nr, $source, $dir, $fstype, 6, $opts) == 0 or die "sandbox init: mount $dir: $!\n";
    } else {
        system('mount', '-t', 'tmpfs', '-o', "nosuid,nodev,$opts", 'agentrl-sandbox', $dir) == 0 or die "sandbox init: mount $dir\n";
    }
}
system('cp', '-a', '.', $workdir) == 0 or die "sandbox init: cannot copy the work dir to $workdir\n";
chdir($workdir) or die "sandbox init: chdir $workdir: $!\n";
my $pid = fork;
defined $pid or die "sandbox init: fork: $!\n";
if (!$pid) {
    open(my $s, '>&=', $fd) and close($s);
    exec {$ARGV[0]} @ARGV or exit 127;
}
my $status;
while ((my $done = wait) > 0) {
    if ($done == $pid) { $status = $?; last }
}
open(my $s, '>&=', $fd) or exit 125;
print $s $status;
close($s);
exit 0;
