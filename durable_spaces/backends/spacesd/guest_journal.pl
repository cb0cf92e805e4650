# The change journal of a Space's workspace, run inside the Space by its daemon (see
# guest_journal.py, which starts it and speaks to it). perl-base only: it is in every
# Debian root filesystem, and a journal must not need an image of its own.
#
# argv: the workspace, KEEP_MAX, KEEP_TOTAL, the most watches to hold (more: untrusted),
# the seconds it waits for a request before it exits, the Space's user ("": none), and
# "miss" for the mutant journal_miss.
#
# Who it runs as: the daemon starts it as the daemon's own user (root in a container or
# a VM), and it takes the Space's user's effective uid and gid here, keeping its real and
# saved uid: it reads no more of the workspace than that user may, while that user can
# neither signal it (kill needs the target's real or saved uid), nor trace it or open its
# /proc entries (ptrace access needs all three, and the change of ids made it
# undumpable). So a command cannot stop it and answer in its place (docs/journal-trust.md).
# Where the daemon runs as the Space's user itself, it stays as it is (and is no more
# protected than any other process of that user). It exits at the end of its stdin (its Space object closed), when idle
# that long (an object never closed: a killed driver's, whose successor's advance kills
# it anyway, or a reader's at epoch 0, which no advance kills), or when it cannot write.
# Each line on stdin is a request (a nonce; "?" and a nonce asks for the machine's boot id,
# a B frame); each answer is frames (type, length, body; K: only "still working") ending
# with an E frame that carries the nonce and "" (trusted) or why it is not ("~" first:
# not for now, and the helper stays; the next trusted answer is a walk).
# The first answer is a walk of the whole workspace; every later one names only what the
# inotify events since the last answer say changed, looked at again.
#
# Soundness is that of the host's journal (durable_spaces/backends/local/journal.py):
# a sync touches a sentinel watched by the same inotify instance and reads until its
# event, so every change a syscall made before the request is read; a directory is
# watched before it is listed and a file before it is stat-ed and read; files are watched
# one by one (a write through a hard link outside the workspace is an event of the
# inode); a directory that appears, goes or moves is walked again; an overflow, a watch
# limit, the workspace root replaced or any mount at or under it make the journal
# untrusted (the host then walks anew or scans its own way). The mount table is read at
# every answer and must name nothing at or under the root, as the host journal's rule
# (durable_spaces/host/mounts.py): a mount that was there when this helper started hides
# what its watches see as much as one made later (an overlay's upper directory outside
# the workspace changes the files under its mount point with no event here). While one
# is there each scan is refused for now ("~" before the reason); the first scan after it
# is a new walk.
use strict;
use warnings;

# No modules beyond strict and warnings: under TCG POSIX and Fcntl each cost a helper's
# start more than perl's own start (docs/performance.md). So the few constants are here: the
# errno values are Linux's generic ones; the open flags and syscall numbers differ by
# machine, which the ELF header of this perl names (e_machine: 62 x86_64, 183 aarch64).
my ($EINTR, $ENOENT, $EAGAIN, $ENOTDIR, $ENOSPC, $ELOOP) = (4, 2, 11, 20, 28, 40);
my %MACHINE = (
    62 => { nr => [294, 254, 255], dir => 0200000, nofollow => 0400000 },
    183 => { nr => [26, 27, 28], dir => 040000, nofollow => 0100000 },
);
my ($O_RDONLY, $O_NONBLOCK) = (0, 04000);
my ($LOCK_EX, $LOCK_NB) = (2, 4);
sub S_ISREG { return ($_[0] & 0170000) == 0100000; }
sub S_ISDIR { return ($_[0] & 0170000) == 0040000; }
sub S_ISLNK { return ($_[0] & 0170000) == 0120000; }

my ($ROOT, $KEEP_MAX, $KEEP_TOTAL, $MAX_WATCHES, $IDLE, $USER, $MISS) = @ARGV;
$MISS = defined $MISS && $MISS eq 'miss';

my ($MODIFY, $ATTRIB, $CLOSE_WRITE) = (0x2, 0x4, 0x8);
my ($MOVED_FROM, $MOVED_TO, $CREATE, $DELETE) = (0x40, 0x80, 0x100, 0x200);
my ($DELETE_SELF, $MOVE_SELF, $UNMOUNT, $Q_OVERFLOW, $IGNORED) =
    (0x400, 0x800, 0x2000, 0x4000, 0x8000);
my ($ONLYDIR, $DONT_FOLLOW, $ISDIR) = (0x1000000, 0x2000000, 0x40000000);
my $DIR_MASK = $CREATE | $DELETE | $MOVED_FROM | $MOVED_TO | $ATTRIB | $DELETE_SELF
    | $MOVE_SELF | $ONLYDIR;
my $FILE_MASK = $MODIFY | $CLOSE_WRITE | $ATTRIB | $DELETE_SELF | $DONT_FOLLOW;
my $ENTRIES = $CREATE | $DELETE | $MOVED_FROM | $MOVED_TO;
my $CONTENT = $MODIFY | $CLOSE_WRITE;

my $broken = '';
my (%dirs, %dir_wd, %files, %file_wd);    # wd -> rel, rel -> wd; wd -> {rel}, rel -> wd
my (%ptrees, %ppaths);                     # what the events named since the last answer
my ($ino_fh, $root_fh, @root_id, $sentinel, $sentinel_dir, $sentinel_wd);
my $sentinel_fh;    # locked while this helper lives (sweep_sentinels)
my ($NR_INIT, $NR_ADD, $NR_RM, $O_DIR, $O_NOFOLLOW);    # set by start() for this machine
my ($out, $budget) = ('', 0);

sub fail { $broken ||= $_[0]; }
sub join_rel { my ($b, $n) = @_; return $b eq '.' ? $n : "$b/$n"; }
sub fdpath { return '/proc/self/fd/' . fileno($_[0]); }

# Frames go out as they fill a MiB, and a K frame at least once a second while an answer
# is worked on: the host gives up on a helper that is silent (stopped), not on one that is
# slow (a walk of a big tree under TCG). The host applies none of them before the E frame
# says the answer is trusted.
my $last_out = time;
sub frame {
    my ($type, $body) = @_;
    $out .= $type . pack('N', length $body) . $body;
    flush_out() if length($out) >= 1 << 20;
}

sub alive { if (time - $last_out >= 1) { frame('K', ''); flush_out(); } }

sub flush_out {
    my $off = 0;
    while ($off < length $out) {
        my $n = syswrite(STDOUT, $out, length($out) - $off, $off);
        if (!defined $n) { next if $! == $EINTR; exit 1; }
        $off += $n;
    }
    ($out, $last_out) = ('', time);
}

sub start {
    my $elf = '';
    if (open(my $exe, '<:raw', '/proc/self/exe')) { read($exe, $elf, 20); close $exe; }
    my $m = length($elf) == 20 ? $MACHINE{unpack('v', substr($elf, 18, 2))} : undef;
    return fail('no inotify syscall numbers for this machine') unless $m;
    ($NR_INIT, $NR_ADD, $NR_RM) = @{ $m->{nr} };
    ($O_DIR, $O_NOFOLLOW) = ($m->{dir} | $m->{nofollow}, $m->{nofollow});
    sysopen($root_fh, $ROOT, $O_RDONLY | $O_DIR)
        or return fail("cannot open the workspace: $!");
    @root_id = (stat $root_fh)[0, 1];
    my $fd = syscall($NR_INIT, 04000 | 02000000);    # IN_NONBLOCK | IN_CLOEXEC
    return fail("inotify_init1: $!") if $fd < 0;
    open($ino_fh, '<&=', $fd) or return fail("inotify fd: $!");
    my $tmp = $ENV{TMPDIR} || '/tmp';
    sweep_sentinels($tmp);
    $sentinel_dir = sprintf('%s/.ds-journal-%d-%d', $tmp, $$, int(rand(1e9)));
    mkdir($sentinel_dir, 0700) or return fail("cannot make the sentinel's directory: $!");
    $sentinel = "$sentinel_dir/sentinel";
    open($sentinel_fh, '>', $sentinel) or return fail("cannot make the sentinel: $!");
    flock($sentinel_fh, $LOCK_EX | $LOCK_NB) or return fail("cannot lock the sentinel: $!");
    $sentinel_wd = add_watch($sentinel, $ATTRIB | $DONT_FOLLOW);
    fail('cannot watch the sentinel') unless defined $sentinel_wd;
}

END { if (defined $sentinel_dir) { unlink $sentinel; rmdir $sentinel_dir; } }

# A helper killed (with its epoch, its Space's machine or its PID namespace) cannot remove
# its sentinel's directory, and PIDs say nothing across namespaces: a live helper holds a
# lock on its sentinel, so a new one removes the directories of this user whose sentinel
# it can lock (or that have none) and that are older than a helper's start.
sub sweep_sentinels {
    my ($tmp) = @_;
    opendir(my $d, $tmp) or return;
    for my $name (grep { /^\.ds-journal-\d+-\d+\z/ } readdir $d) {
        my $dir = "$tmp/$name";
        my @st = lstat $dir;
        next unless @st && S_ISDIR($st[2]) && $st[4] == $> && time - $st[9] > 60;
        if (sysopen(my $f, "$dir/sentinel", $O_RDONLY | $O_NOFOLLOW)) {
            next unless flock($f, $LOCK_EX | $LOCK_NB);
            unlink "$dir/sentinel";
            close $f;
        }
        rmdir $dir;
    }
    closedir $d;
}

# One helper per workspace: another one of this script for this workspace answers a Space
# object that no longer asks (a machine restored or forked from a checkpoint brings back
# the helper that ran when it was taken, and an advance to the same epoch spares it), and
# would otherwise run until its idle exit. Killed here, at a new helper's start.
sub sweep_others {
    local $/;
    open(my $me, '<:raw', '/proc/self/cmdline') or return;
    my @mine = split /\0/, (<$me> // ''), -1;
    close $me;
    return unless @mine >= 4;
    opendir(my $pd, '/proc') or return;
    for my $pid (grep { /^\d+$/ && $_ != $$ } readdir $pd) {
        open(my $c, '<:raw', "/proc/$pid/cmdline") or next;
        my @a = split /\0/, (<$c> // ''), -1;
        close $c;
        kill 'KILL', $pid
            if @a >= 4 && $a[0] eq $mine[0] && $a[1] eq '-e' && $a[2] eq $mine[2]
            && $a[3] eq $ROOT;
    }
    closedir $pd;
}

# The Space's user's effective ids, real and saved ones kept (the header says why).
sub become_user {
    return if !defined $USER || $USER eq '';
    my ($uid, $gid) = (getpwnam($USER))[2, 3];
    return fail("no user $USER in the Space") unless defined $uid;
    return if $> == $uid && $< == $uid;    # started as that user: nothing to take
    return fail("the helper runs as uid $> and cannot take the ids of $USER") if $> != 0;
    $) = "$gid $gid";    # the effective gid, and that group alone as supplementary
    return fail("cannot take the group of $USER: $!") if (split / /, $))[0] != $gid;
    $> = $uid;
    return fail("cannot take the uid of $USER: $!") if $> != $uid;
}

sub watches { return scalar(keys %dirs) + scalar(keys %files); }

sub add_watch {
    my ($path, $mask) = @_;
    return undef if $broken;
    if (watches() >= $MAX_WATCHES) { fail("more than $MAX_WATCHES watches"); return undef; }
    my $wd = syscall($NR_ADD, fileno($ino_fh), $path, $mask);
    return $wd if $wd >= 0;
    my $err = $! + 0;
    return undef if $err == $ENOENT || $err == $ENOTDIR || $err == $ELOOP;    # gone: its dir says
    fail($err == $ENOSPC
        ? 'the inotify watch limit was hit (fs.inotify.max_user_watches)'
        : "cannot watch $path: $!");
    return undef;
}

sub rm_watch { syscall($NR_RM, fileno($ino_fh), $_[0]); }

sub watch_dir {
    my ($rel, $fh) = @_;
    my $wd = add_watch(fdpath($fh), $DIR_MASK);
    return 0 unless defined $wd;
    my $old = $dir_wd{$rel};
    delete $dirs{$old} if defined $old && $old != $wd;
    my $prev = $dirs{$wd};
    delete $dir_wd{$prev} if defined $prev && $prev ne $rel && ($dir_wd{$prev} // -1) == $wd;
    $dirs{$wd} = $rel;
    $dir_wd{$rel} = $wd;
    return 1;
}

sub unlink_file {
    my ($rel, $wd) = @_;
    my $rels = $files{$wd} or return;
    delete $rels->{$rel};
    if (!%$rels) { delete $files{$wd}; rm_watch($wd); }
}

sub watch_file {
    my ($rel, $path) = @_;
    my $wd = add_watch($path, $FILE_MASK);
    return 0 unless defined $wd;
    my $old = $file_wd{$rel};
    unlink_file($rel, $old) if defined $old && $old != $wd;
    $files{$wd}{$rel} = 1;
    $file_wd{$rel} = $wd;
    return 1;
}

sub forget {
    my ($rel, $tree) = @_;
    my $wd = delete $file_wd{$rel};
    unlink_file($rel, $wd) if defined $wd;
    return unless $tree;
    my $prefix = "$rel/";
    for my $p (grep { index($_, $prefix) == 0 } keys %file_wd) {
        unlink_file($p, delete $file_wd{$p});
    }
    for my $p (grep { $_ eq $rel || index($_, $prefix) == 0 } keys %dir_wd) {
        my $dwd = delete $dir_wd{$p};
        delete $dirs{$dwd};
        rm_watch($dwd);
    }
}

# The directory at workspace path $rel, opened without following any symlink on the way.
sub open_dir {
    my ($rel) = @_;
    my $fh = $root_fh;
    return $fh if $rel eq '.';
    for my $part (split m{/}, $rel) {
        my $next;
        sysopen($next, fdpath($fh) . "/$part", $O_RDONLY | $O_DIR)
            or return undef;
        $fh = $next;
    }
    return $fh;
}

# One non-directory entry looked at: its record, or D when it is none the table holds.
sub look {
    my ($rel, $path, $lmode) = @_;
    if (S_ISLNK($lmode)) {
        forget($rel, 0);
        my $target = readlink($path);
        if (defined $target) { frame('L', pack('N/a* N/a*', $rel, $target)); }
        else { frame('D', pack('N/a*', $rel)); }
        return;
    }
    if (!S_ISREG($lmode)) { forget($rel, 0); frame('D', pack('N/a*', $rel)); return; }
    return unless watch_file($rel, $path);
    my $fh;
    if (!sysopen($fh, $path, $O_RDONLY | $O_NOFOLLOW | $O_NONBLOCK)) {
        if ($! == $ENOENT) { forget($rel, 0); frame('D', pack('N/a*', $rel)); return; }
        my @st = lstat $path;    # unreadable: listed, hashed by the host's way (or not)
        frame('F', pack('N/a* N Q> c N/a*', $rel, $st[2] & 07777, $st[7], 0, ''))
            if @st && S_ISREG($st[2]);
        return;
    }
    my @st = stat $fh;
    if (!S_ISREG($st[2])) { forget($rel, 0); frame('D', pack('N/a*', $rel)); return; }
    my ($size, $data, $has) = ($st[7], '', 0);
    if ($size < $KEEP_MAX && $budget + $size <= $KEEP_TOTAL) {
        my $got = 0;
        while (1) {
            my $n = sysread($fh, $data, 65536, length $data);
            if (!defined $n) { next if $! == $EINTR; $got = -1; last; }
            last if $n == 0;
            last if length($data) > $KEEP_MAX;    # grew while read: hashed the host's way
        }
        if ($got == 0 && length($data) <= $KEEP_MAX) {
            ($has, $size) = (1, length $data);
            $budget += $size;
        } else {
            $data = '';
        }
    }
    frame('F', pack('N/a* N Q> c N/a*', $rel, $st[2] & 07777, $size, $has, $data));
}

sub walk {
    my ($top) = @_;
    my @stack = ($top);
    while (@stack && !$broken) {
        my $d = pop @stack;
        my $fh = open_dir($d) or next;
        watch_dir($d, $fh) or next;
        opendir(my $dh, fdpath($fh)) or next;
        my @names = grep { $_ ne '.' && $_ ne '..' } readdir $dh;
        closedir $dh;
        for my $name (@names) {
            alive();
            my $rel = join_rel($d, $name);
            my $path = fdpath($fh) . "/$name";
            my @st = lstat $path or next;
            if (S_ISDIR($st[2])) { push @stack, $rel; next; }
            look($rel, $path, $st[2]);
            last if $broken;
        }
    }
}

# A path an event named, looked at again: a directory that is new here is walked. T
# drops a path and all under it from the host's table (a watch's IGNORED may have
# forgotten what it was), D the path alone.
sub relook {
    my ($rel, $tree) = @_;
    my ($dir, $name) = $rel =~ m{^(?:(.*)/)?([^/]+)$};
    $dir = '.' unless defined $dir && $dir ne '';
    my $fh = open_dir($dir);
    my @st = $fh ? lstat(fdpath($fh) . "/$name") : ();
    my $is_dir = @st && S_ISDIR($st[2]);
    my $was_dir = exists $dir_wd{$rel};
    return if $is_dir && $was_dir && !$tree;    # its own attributes: its contents are watched
    if ($tree || !@st || $is_dir || $was_dir) {
        forget($rel, 1);
        frame('T', pack('N/a*', $rel));
        return unless @st;
        if ($is_dir) { walk($rel); return; }
    }
    look($rel, fdpath($fh) . "/$name", $st[2]);
}

# One event into the pending sets; true for the sentinel's.
sub event {
    my ($wd, $mask, $name) = @_;
    if ($mask & $Q_OVERFLOW) { fail('the inotify queue overflowed (events were lost)'); return 0; }
    if ($mask & $UNMOUNT) { fail('a watched filesystem was unmounted'); return 0; }
    return 1 if defined $sentinel_wd && $wd == $sentinel_wd;
    return 0 if $MISS && ($mask & $CONTENT);    # the mutant: a change of contents unrecorded
    if (defined(my $base = $dirs{$wd})) {
        if ($name ne '') {
            my $rel = join_rel($base, $name);
            if (($mask & $ISDIR) && ($mask & $ENTRIES)) { $ptrees{$rel} = 1; }
            else { $ppaths{$rel} = 1; }
        } elsif ($mask & ($DELETE_SELF | $MOVE_SELF | $IGNORED)) {
            if ($base eq '.') { fail('the workspace directory itself was moved or removed'); return 0; }
            $ptrees{$base} = 1;
        }
        if ($mask & $IGNORED) {
            delete $dirs{$wd};
            delete $dir_wd{$base} if ($dir_wd{$base} // -1) == $wd;
        }
        return 0;
    }
    if (my $rels = $files{$wd}) {
        $ppaths{$_} = 1 for keys %$rels;
        if ($mask & $IGNORED) {
            delete $files{$wd};
            for my $r (keys %$rels) { delete $file_wd{$r} if ($file_wd{$r} // -1) == $wd; }
        }
    }
    return 0;
}

# Read every queued event, up to the sentinel's (touched here, after the request came).
sub sync {
    utime(undef, undef, $sentinel) or return fail("cannot touch the sentinel: $!");
    my ($seen, $buf) = (0, '');
    while (!$broken) {
        my $n = sysread($ino_fh, $buf, 65536);
        if (!defined $n) {
            next if $! == $EINTR;
            return fail("reading the journal failed: $!") unless $! == $EAGAIN;
            last if $seen;
            my $rin = '';
            vec($rin, fileno($ino_fh), 1) = 1;
            return fail("the journal's sentinel event did not arrive")
                unless select($rin, undef, undef, 2) > 0;
            next;
        }
        my $off = 0;
        while ($off + 16 <= length $buf) {
            my ($wd, $mask, $cookie, $len) = unpack('l L L L', substr($buf, $off, 16));
            my $name = unpack('Z*', substr($buf, $off + 16, $len));
            $off += 16 + $len;
            $seen = 1 if event($wd, $mask, $name);
        }
    }
}

# A mount point at or under the workspace, whenever it was made (undef: none): one there
# hides what the watches see (one above it replaces the root, which check_root sees).
sub mount_inside {
    open(my $mi, '<', '/proc/self/mountinfo') or return 'cannot read the mount table';
    while (my $line = <$mi>) {
        my $mp = (split / /, $line)[4];
        next unless defined $mp;
        $mp =~ s/\\([0-7]{3})/chr(oct($1))/ge;
        return "a filesystem is mounted at $mp, inside the workspace"
            if $mp eq $ROOT || index($mp, "$ROOT/") == 0;
    }
    return undef;
}

# Every watch dropped: what the next walk finds is watched again from scratch.
sub unwatch_all {
    rm_watch($_) for keys %dirs, keys %files;
    (%dirs, %dir_wd, %files, %file_wd, %ptrees, %ppaths) = ();
}

sub check_root {
    my @now = lstat $ROOT;
    return fail('the workspace directory is gone') unless @now;
    return fail('the workspace directory was replaced')
        if $now[0] != $root_id[0] || $now[1] != $root_id[1];
}

sub under_tree {
    my ($p) = @_;
    for my $t (keys %ptrees) { return 1 if $t eq '.' || index($p, "$t/") == 0; }
    return 0;
}

# The next request line, or undef: end of input, or none within $IDLE seconds.
my $inbuf = '';
sub request {
    while (index($inbuf, "\n") < 0) {
        my $rin = '';
        vec($rin, fileno(STDIN), 1) = 1;
        my $ready = select($rin, undef, undef, $IDLE);
        next if $ready < 0 && $! == $EINTR;
        return undef if $ready <= 0;
        my $n = sysread(STDIN, $inbuf, 4096, length $inbuf);
        next if !defined $n && $! == $EINTR;
        return undef unless $n;
    }
    my $at = index($inbuf, "\n");
    my $line = substr($inbuf, 0, $at);
    substr($inbuf, 0, $at + 1) = '';
    return $line;
}

sweep_others();
become_user();
start() unless $broken;
my $first = 1;
while (defined(my $nonce = request())) {
    if ($nonce =~ s/^\?//) {    # the machine's boot id, read now: no sync, no walk
        if (!$broken) {
            open(my $bf, '<', '/proc/sys/kernel/random/boot_id')
                or fail("cannot read the boot id: $!");
            my $id = $bf ? <$bf> : undef;
            chomp $id if defined $id;
            frame('B', pack('N/a*', $id)) if defined $id && !$broken;
        }
        $out = '' if $broken;
        frame('E', pack('N/a* N/a*', $nonce, $broken));
        flush_out();
        next;
    }
    $budget = 0;
    if (!$broken) {
        check_root();
        my $hidden = $broken ? undef : mount_inside();
        if (defined $hidden) {
            # Not trusted while it is there, nor after it goes: what changed under it
            # raised no event here. This helper stays (a new one would refuse as well,
            # and the boot id needs no trust in the workspace) and, once no mount is
            # left, answers with a new walk. "~": a refusal for now, not for good.
            unwatch_all();
            $first = 1;
            frame('E', pack('N/a* N/a*', $nonce, "~$hidden"));
            flush_out();
            next;
        }
        if ($first) {
            frame('T', pack('N/a*', '.'));
            walk('.');
        } else {
            sync();
            my @trees = sort keys %ptrees;
            my %t = map { $_ => 1 } @trees;
            for my $tree (@trees) {
                last if $broken;
                my $outer = 0;
                for my $o (@trees) { $outer = 1 if $o ne $tree && index($tree, "$o/") == 0; }
                next if $outer;
                relook($tree, 1) if $tree ne '.';
            }
            for my $p (sort keys %ppaths) {
                last if $broken;
                alive();
                relook($p, 0) unless $t{$p} || under_tree($p);
            }
            %ptrees = ();
            %ppaths = ();
        }
        $first = 0;
    }
    $out = '' if $broken;    # an untrusted answer is no answer (the E frame says so)
    frame('E', pack('N/a* N/a*', $nonce, $broken));
    flush_out();
}
