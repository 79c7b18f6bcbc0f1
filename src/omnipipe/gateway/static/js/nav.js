// The header shared by every page: brand, links, and the current page marked with aria-current.
// Pages include <header class="site-header" data-site-nav></header> and load this module. The Omni link shows once
// the served model is known to take images or video (omni-offer.js), and always on the omni page itself.

import { omniOffered } from "./omni-offer.js";

const LINKS = [
  { href: "/", label: "Home" },
  { href: "/chat", label: "Chat" },
  { href: "/voice", label: "Voice" },
  { href: "/omni", label: "Omni", offered: omniOffered },
  { href: "/admin", label: "Admin" },
];

function currentHref(pathname) {
  if (pathname === "/" || pathname === "/index.html") return "/";
  const match = LINKS.find((link) => link.href !== "/"
    && (pathname === link.href || pathname.startsWith(`${link.href}/`)));
  return match ? match.href : null;
}

export function renderNav(root = document.querySelector("[data-site-nav]")) {
  if (!root) return;
  const current = currentHref(window.location.pathname);
  const skip = document.createElement("a");
  skip.className = "skip-link";
  skip.href = "#main";
  skip.textContent = "Skip to content";

  const inner = document.createElement("div");
  inner.className = "inner";

  const brand = document.createElement("a");
  brand.className = "brand";
  brand.href = "/";
  const logo = document.createElement("img");
  logo.src = "/static/favicon.svg";
  logo.alt = "";
  brand.append(logo, "omnipipe");

  const nav = document.createElement("nav");
  nav.className = "site-nav";
  nav.setAttribute("aria-label", "Main");
  const list = document.createElement("ul");
  for (const link of LINKS) {
    const item = document.createElement("li");
    const a = document.createElement("a");
    a.href = link.href;
    a.textContent = link.label;
    if (link.href === current) a.setAttribute("aria-current", "page");
    item.append(a);
    if (link.offered && link.href !== current) {
      item.hidden = true;
      link.offered().then((offered) => { item.hidden = !offered; });
    }
    list.append(item);
  }
  nav.append(list);
  inner.append(brand, nav);
  root.replaceChildren(skip, inner);
}

renderNav();
