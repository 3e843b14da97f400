# lesson.mk - make inside a lesson's folder. The lessons build from the repository root,
# where ddp.h is, so every target goes to the Makefile there:
#   make          the same as make lesson-N at the root: builds and checks the exercise
#   make ranks    builds this folder's ranks.c (any program here), then run ./ranks --nproc 4
# Relative, and the folder's name as the last word of its path: make splits a path with a
# space in it into words.
root := ../../..
name := $(lastword $(subst /, ,$(CURDIR)))
here := examples/lessons/$(name)
lesson := $(patsubst 0%,%,$(firstword $(subst _, ,$(name))))

check:
	@$(MAKE) --no-print-directory -C $(root) lesson-$(lesson)
lessons:
	@$(MAKE) --no-print-directory -C $(root) $@
lesson-%:
	@$(MAKE) --no-print-directory -C $(root) $@
%: force # the binary here is the root's target: its Makefile decides whether it is up to date
	@$(MAKE) --no-print-directory -C $(root) $(here)/$@
Makefile ../lesson.mk force: ;
.PHONY: check lessons force
