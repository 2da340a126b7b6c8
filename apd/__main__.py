import sys

try:
    from apd.cli import main
except KeyboardInterrupt:  # Ctrl-C before main() takes the signals over (apd.cli imports little): nothing was started
    print("apd: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
