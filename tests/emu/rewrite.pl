#!/usr/bin/perl
# tests/emu/rewrite.pl - the changes the CUDA emulator needs in a GPU source, made
# on a copy (make emu writes the copies under build/emu/src), line for line so that
# compiler messages and a debugger point at the original lines:
#   k<<<grid, block, shmem, stream>>>(args)  ->  EMU_LAUNCH(k)(grid, block, shmem, stream)(args)
#     (C++ cannot parse <<<; k may be a template-id such as f<F, HS> or a macro parameter)
#   __shared__ float a[N], b[M];  ->  the same, then EMU_SHARED(a); EMU_SHARED(b);
#     (the arrays are filled with 0xFF at the start of every block: reads before writes show)
#   asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t))  ->  (t) = ::emu::globaltimer()
#     (the one inline PTX the sources use: a kernel that spins to take time)
#   reinterpret_cast<const int4 *>(p + i)  ->  ::emu::aligned(__FILE__, __LINE__, reinterpret_cast<const int4 *>(p + i))
#     (vector types only: a GPU faults on a misaligned vector access, a CPU does not), and
#   (const int4 *)(p + i) or (int4 *)p  ->  the same, wrapped so (a C-style cast of a
#     parenthesized expression or a name; not of &x[i] or p[i])
#   __launch_bounds__(N, ...) ... {  ->  the same, then ::emu::launch_bounds(__FILE__, __LINE__, N); after the
#     kernel's first { (a GPU refuses a launch of more threads a block than N; the macro itself is empty)
# Reads a file on stdin (or the files named), writes the result on stdout.
use strict;
use warnings;

my $bounds; # the first argument of a __launch_bounds__ whose kernel body has not begun yet
while (my $line = <>) {
    if ($line =~ /\b__launch_bounds__\s*(\((?:[^()]++|(?1))*\))/) {
        ($bounds = substr($1, 1, -1)) =~ s/^((?:[^(),]++|(\((?:[^()]++|(?-1))*\)))*).*/$1/s; # up to a top-level comma
    }
    if (defined $bounds && $line =~ s/\{/{ ::emu::launch_bounds(__FILE__, __LINE__, $bounds);/) {
        undef $bounds;
    }
    $line =~ s{((?:::)?[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*(?:\s*<[^<>;()]*>)?)\s*<<<(.*?)>>>}{EMU_LAUNCH($1)($2)}g;
    $line =~ s{(\breinterpret_cast\s*<\s*(?:const\s+)?(?:int|uint|float)[24]\s*\*\s*>\s*(\((?:[^()]++|(?-1))*\)))}{::emu::aligned(__FILE__, __LINE__, $1)}g;
    $line =~ s{(?<![\w>\]])(\(\s*(?:const\s+)?(?:int|uint|float)[24]\s*\*\s*\)\s*(?:(\((?:[^()]++|(?-1))*\))|[A-Za-z_]\w*))}{::emu::aligned(__FILE__, __LINE__, $1)}g;
    $line =~ s{\basm\s+volatile\s*\(\s*"mov\.u64 %0, %%globaltimer;"\s*:\s*"=l"\s*\(([^()]*)\)\s*\)}{($1) = ::emu::globaltimer()}g;
    if ($line =~ /^(.*?\b__shared__\s+)([^;]*);(.*)$/s && $1 !~ /\bextern\b/) {
        my ($head, $decl, $rest) = ($1, $2, $3);
        (my $bare = $decl) =~ s/\[[^\]]*\]//g;  # array bounds
        1 while $bare =~ s/<[^<>]*>//g;          # template arguments
        my @names = map { /(\w+)\s*$/ ? $1 : () } split /,/, $bare;
        $line = $head . $decl . ';' . join('', map { " EMU_SHARED($_);" } @names) . $rest;
    }
    print $line;
}
