"""Source that the golden tracebacks point into (rich shows these lines); never executed."""


def step(batch):
    return 1 / batch


def main():
    try:
        step(0)
    except ZeroDivisionError as exc:
        raise ValueError("bad batch") from exc


if __name__ == "__main__":
    main()
